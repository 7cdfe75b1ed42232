"""The models that ship with tinydiff; installed as the package data tinydiff/models/.

Each folder is a Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json) with a
model card (README.md) saying how it was made and how to make it again.
"""
