"""Model definitions. TinyTransformer is the one model; PRESETS name its sizes."""

from .transformer import (PRESETS, Block, TinyTransformer, TransformerConfig, attention_forward,
                          block_forward, block_forward_recompute, config_for, mlp_hidden, mlp_output)

__all__ = ["PRESETS", "Block", "TinyTransformer", "TransformerConfig", "attention_forward", "block_forward",
           "block_forward_recompute", "config_for", "mlp_hidden", "mlp_output"]
