"""Making and judging models: the corpus reader, the trainer (needs torch: the `train` extra) and
`tinydiff eval` (bits per byte, ELBO, judge perplexity)."""
