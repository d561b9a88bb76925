"""Model definitions: TinyTransformer (Qwen3 layout) and its config presets (transformer), selective
recompute of a block (recompute), generation's forward over a KV cache (decode) and the generator
(generate)."""

from .transformer import PRESETS, Attention, Block, MLP, TinyTransformer, TransformerConfig, config_for

__all__ = ["PRESETS", "Attention", "Block", "MLP", "TinyTransformer", "TransformerConfig", "config_for"]
