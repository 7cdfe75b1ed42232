"""tinydiff: a from-scratch CPU inference engine for autoregressive and masked-diffusion LMs.

    import tinydiff
    model = tinydiff.load("weights/...")
    print(model.generate("Once upon a time", max_new_tokens=64))
"""
import sys

from .chat import Chat
from .engine import cost, masks
from .engine.ledger import Ledger
from .errors import ModelError, TinydiffError, UsageError
from .formats.tokenizer import Tokenizer
from .model import Model, load, set_batch_invariant, set_threads

__all__ = ["load", "Model", "Chat", "Tokenizer", "Ledger", "cost", "masks", "set_threads", "set_batch_invariant",
           "TinydiffError", "UsageError", "ModelError"]
__version__ = "0.1.0"

# `import tinydiff.cost` and `from tinydiff.masks import CAUSAL` keep working: public names whose
# modules now live in engine/
sys.modules[__name__ + ".cost"], sys.modules[__name__ + ".masks"] = cost, masks
