"""Configs of real model shapes, for benchmarks with random weights (no download needed)."""
from ..engine.config import config_from_dict

SHAPES = {
    # llama2.c's stories15M
    "stories15M": dict(model_type="llama", hidden_size=288, num_hidden_layers=6, num_attention_heads=6,
                       num_key_value_heads=6, intermediate_size=768, vocab_size=32000,
                       max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # llama2.c's stories42M (the llama.cpp reference: ~250 t/s F32, 470-610 Q8_0 on 2 cores)
    "stories42M": dict(model_type="llama", hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=8, intermediate_size=1376, vocab_size=32000,
                       max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # HuggingFaceTB/SmolLM2-135M
    "SmolLM2-135M": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                         max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
    # GSAI-ML/LLaDA-8B's shape scaled down 4x in width and depth to fit a laptop (vocabulary kept)
    "LLaDA-8B/4": dict(model_type="llama", hidden_size=1024, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=8, intermediate_size=3072, vocab_size=126464,
                       max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
                       tie_word_embeddings=False, is_causal=False, mask_token_id=126336),
}


def shape_config(name):
    return config_from_dict(SHAPES[name], where=f"shape {name}")


def random_model(name, seed=0, weight_type="f32"):
    """A Model of a real shape with random weights and no tokenizer (token ids only); its matrices
    stored as weight_type (tinydiff.formats.quant: f32, f16, bf16, q8_0, q4_0)."""
    from ..engine.weights import random_weights
    from ..model import Model
    cfg = shape_config(name)
    return Model(cfg, stored_as(random_weights(cfg, seed), weight_type), tokenizer=None)


def stored_as(weights, weight_type):
    """Weights with every matrix stored as weight_type (from whatever type it has); the vectors
    (norms, biases) stay f32 and a tied LM head stays the embedding itself."""
    from ..engine.weights import LayerWeights, Weights
    from ..formats import quant

    def q(a):
        return quant.quantize(a, weight_type) if a is not None and a.ndim == 2 else a

    w = weights
    embed = q(w.embed_tokens)
    layers = [LayerWeights(**{field: q(a) for field, a in vars(lw).items()}) for lw in w.layers]
    return Weights(embed, layers, w.norm, embed if w.lm_head is w.embed_tokens else q(w.lm_head))
