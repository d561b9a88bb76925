"""Model definitions. TinyTransformer is the one model; PRESETS name its sizes."""

from .transformer import (PRESETS, Block, TinyTransformer, TransformerConfig, block_forward,
                          config_for)

__all__ = ["PRESETS", "Block", "TinyTransformer", "TransformerConfig", "block_forward", "config_for"]
