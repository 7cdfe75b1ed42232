"""The engine: a model's Config and Weights (from config.json + safetensors, or GGUF), the weight
types (quant), the Transformer's forward pass, and the C kernels under it (kernels, csrc/)."""
