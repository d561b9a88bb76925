"""Model definitions: TinyTransformer (Qwen3 layout) and its config presets."""

from .transformer import PRESETS, Attention, Block, MLP, TinyTransformer, TransformerConfig, config_for

__all__ = ["PRESETS", "Attention", "Block", "MLP", "TinyTransformer", "TransformerConfig", "config_for"]
