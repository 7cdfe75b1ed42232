"""Files in and out: safetensors and GGUF containers, tokenizer.json and its BPE, all read without
copying where the bytes allow. Nothing here knows what a transformer is."""
