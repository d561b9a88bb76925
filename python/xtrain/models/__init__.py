"""Model definitions: TinyTransformer (Qwen3 layout) and its config presets (transformer), GPT2 and
its presets (gpt2), selective recompute of a block (recompute), generation's forward over a KV
cache (decode, gpt2_decode) and the generator (generate).

The architecture registry: a checkpoint's config record names its architecture ("arch"; a record
without one is the Qwen3-style model of the checkpoints written before GPT-2 existed), and
config_from_dict / model_class build the right model from it; preset_config picks from every
architecture's presets (the names are distinct).
"""

from . import gpt2
from .gpt2 import GPT2, GPT2Config
from .transformer import PRESETS, Attention, Block, MLP, TinyTransformer, TransformerConfig, config_for

# arch name -> (model class, config class, presets)
ARCHITECTURES = {
    "qwen3": (TinyTransformer, TransformerConfig, PRESETS),
    gpt2.ARCH: (GPT2, GPT2Config, gpt2.PRESETS),
}
ALL_PRESETS = {name: arch for arch, (_, _, presets) in ARCHITECTURES.items() for name in presets}


def arch_of(record: dict) -> str:
    """The architecture a config record names ("qwen3" when it names none)."""
    arch = record.get("arch", "qwen3") if isinstance(record, dict) else None
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown model architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    return arch


def config_from_dict(record: dict):
    """The config (TransformerConfig or GPT2Config) of a to_dict() record."""
    arch = arch_of(record)
    if arch == "qwen3":
        return TransformerConfig.from_dict({k: v for k, v in record.items() if k != "arch"})
    return ARCHITECTURES[arch][1].from_dict(record)


def model_class(config):
    """The model class of a config object."""
    for cls, config_cls, _ in ARCHITECTURES.values():
        if type(config) is config_cls:
            return cls
    raise TypeError(f"no model architecture takes a {type(config).__name__}")


def config_classes() -> dict:
    """arch name -> config class: what hf_import.read_pretrained takes to read any architecture."""
    return {arch: config_cls for arch, (_, config_cls, _) in ARCHITECTURES.items()}


def preset_config(preset: str, vocab_size: int, **overrides):
    """The config of any architecture's preset, with the tokenizer's vocabulary."""
    if preset not in ALL_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(ALL_PRESETS)}")
    if ALL_PRESETS[preset] == "qwen3":
        return config_for(preset, vocab_size, **overrides)
    return gpt2.config_for(preset, vocab_size, **overrides)


__all__ = ["ALL_PRESETS", "ARCHITECTURES", "GPT2", "GPT2Config", "PRESETS", "Attention", "Block", "MLP",
           "TinyTransformer", "TransformerConfig", "arch_of", "config_classes", "config_for", "config_from_dict", "model_class",
           "preset_config"]
