"""What a pass costs and how fast it runs: the FLOP and byte formulas (cost), the ledger the
kernels book them into, the machine's roofline, `tinydiff cost` and `tinydiff bench`, the
real model shapes they run with random weights, and `tinydiff perplexity` (perplexity.py:
llama-perplexity's figure of a text, and KL-divergence against a reference model)."""
