"""Turning logits into text: autoregressive generation (generate), masked diffusion (diffusion),
token choice for both (sampling), and the live terminal view of denoising (visual). They run a
Transformer and never reach back up to the Model."""
