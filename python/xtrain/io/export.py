"""Export a checkpoint as a Hugging Face Qwen3 (or, without q/k norm, Llama) model directory, or a
GPT-2 run as a GPT2LMHeadModel directory (models/hf_gpt2.py holds its names and config).

    out/model.safetensors        model.embed_tokens.weight, model.layers.N.self_attn.{q,k,v,o}_proj
                                 .weight, ...self_attn.{q,k}_norm.weight (Qwen3), ...mlp.{gate,up,
                                 down}_proj.weight, ...{input,post_attention}_layernorm.weight,
                                 model.norm.weight, lm_head.weight (untied models) (bf16 or f32)
    out/config.json              Qwen3Config (architectures Qwen3ForCausalLM), or LlamaConfig
                                 (LlamaForCausalLM) for a model with qk_norm off
    out/generation_config.json   bos/eos ids
    out/tokenizer.json           the run's tokenizer.json (bpe and hf kinds), unchanged, or
    out/tokenizer.model          its SentencePiece model (sentencepiece kind), unchanged
    out/tokenizer_config.json    PreTrainedTokenizerFast (SentencePieceBackend for a .model) with
                                 the end-of-text token as bos/eos/pad, nothing added to encoded
                                 text (Tokenizer.hf_files)

Decisions:
- The model's parameter names already mirror Qwen3 (models/transformer.py), so the mapping is a
  "model." prefix (lm_head stays), and no weight is permuted: our RoPE is rotate-half like HF's.
- The layout follows the config: q/k norm on is Qwen3 (which always has it), off is Llama (which
  never has it; otherwise the same blocks, names and RoPE). Grouped-query attention is
  num_key_value_heads. A tied model writes tie_word_embeddings: true and, as transformers does, no
  lm_head tensor. xtrain.models.hf_import reads both layouts back to the same config and bits.
- The safetensors file goes through the safetensors library's low-level `serialize` (raw bfloat16
  bits: numpy has no bfloat16 type, so `safetensors.numpy` cannot write it). float32 -> bf16 rounds
  to nearest even, as torch does. The library orders tensors deterministically and the JSON files
  have sorted keys and no timestamps: the same checkpoint exports to the same bytes every time.
- `ckpt_dir` may be a run folder (`xtrain train --out RUN`): a path that is not itself a checkpoint
  but holds RUN/ckpt names that checkpoint (checkpoint_in; `xtrain sample` reads it the same way).
- Safe to point anywhere: the target may not be (or lie inside) a checkpoint directory, must be
  empty unless overwrite=True, and is written through a staging directory (rundir.staging_dir),
  so a failed export leaves it unchanged. The tokenizer is the one loaded from the checkpoint's
  listed, hash-checked files; a Qwen3/Llama run with GPT-2's (tiktoken) tokenizer has no Hugging
  Face tokenizer files and is refused, as is a checkpoint with non-finite weights. A GPT-2 model
  with that tokenizer is written without tokenizer files: its tokenizer is Hugging Face's "gpt2".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from xtrain.io import state as ckpt_state
from xtrain.models import GPT2Config, hf_gpt2
from xtrain.models.hf_import import hf_name
from xtrain.io.rundir import check_export_dir, ensure_dir, staging_dir

# Where `xtrain train --out RUN` keeps its checkpoint (xtrain.trainer.train.CKPT_DIR).
RUN_CHECKPOINT = "ckpt"
SAFETENSORS_DTYPES = {"bf16": "bfloat16", "f32": "float32"}
TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "f32": "float32"}
STAGING_DIR = ".xtrain-export.tmp"


def checkpoint_in(path) -> Path:
    """The checkpoint `path` names: itself when it is one (or its NAME.old, see state.resolve),
    else the checkpoint of the run folder `path` (PATH/ckpt, which state.load then checks).
    CheckpointError saying what was looked for when it is neither."""
    path = Path(path)
    # Each look is taken under the reader's lock of the directory it looks into: a save publishes
    # with two renames under the writer's lock, and a look between them would find no checkpoint.
    with ckpt_state.reading(path):
        if ckpt_state.exists(path):
            return path
    run_ckpt = path / RUN_CHECKPOINT
    with ckpt_state.reading(run_ckpt):
        if path.is_dir() and (run_ckpt.exists() or ckpt_state.exists(run_ckpt)):
            return run_ckpt
    raise ckpt_state.CheckpointError(
        f"no checkpoint at {path}: looked for a checkpoint ({path / ckpt_state.STATE_FILE}) and for a run "
        f"folder's ({run_ckpt / ckpt_state.STATE_FILE})")


def export(ckpt_dir, out_dir, dtype: str = "bf16", overwrite: bool = False) -> Path:
    """Write checkpoint `ckpt_dir` (or a run folder's, checkpoint_in) as a Hugging Face directory
    `out_dir`. Refuses a target inside a checkpoint directory, a non-empty target unless
    `overwrite` (then same-named files are replaced), and a checkpoint whose weights hold NaN or
    Inf."""
    if dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SAFETENSORS_DTYPES)}, got {dtype!r}")
    source = checkpoint_in(ckpt_dir)
    with ckpt_state.reading(source):  # a save into the run waits: one checkpoint's files
        ckpt = ckpt_state.load(source)
        out = Path(out_dir)
        check_export_dir(ckpt.path, out, overwrite, ignore=(STAGING_DIR,))
        config = ckpt.config
        gpt2 = isinstance(config, GPT2Config)
        tok = ckpt.tokenizer()
        # The listed, hash-checked files (load() verified them), as AutoTokenizer reads them. GPT-2's
        # own (tiktoken) tokenizer has none to write: it is Hugging Face's "gpt2" tokenizer.
        tok_files = {} if gpt2 and tok.kind == "gpt2" else tok.hf_files(model_max_length=config.max_seq)
        tensors = ckpt.model_tensors()  # names and shapes were checked against the config by load()
    found = ckpt_state.non_finite(tensors)
    if found:
        raise ckpt_state.CheckpointError(f"{ckpt.path}: weight {found[0]} holds {found[1]} non-finite "
                                         f"values (NaN or Inf); refusing to export it")

    eot = ckpt.tokenizer_meta["eot_id"]
    if gpt2:  # GPT2LMHeadModel's names and layout (models/hf_gpt2.py)
        hf = hf_gpt2.hf_tensors(tensors, config)
        hf_cfg = hf_gpt2.hf_config(config, TORCH_DTYPE_NAMES[dtype], eot)
    else:
        hf = {hf_name(n): t for n, t in tensors.items()}
        hf_cfg = hf_config(config, dtype, eot)
    files = {
        "model.safetensors": safetensors_bytes(hf, dtype, {"format": "pt"}),
        "config.json": _json_bytes(hf_cfg),
        "generation_config.json": _json_bytes({"bos_token_id": eot, "eos_token_id": eot,
                                               "pad_token_id": eot}),
        **tok_files,
    }
    ensure_dir(out)
    # Everything is written and synced in a staging directory first, then moved into place: a
    # failure (a full disk) leaves the target as it was, and no temporary file behind.
    with staging_dir(out / STAGING_DIR, f"the export {out}") as tmp:
        for name, data in files.items():
            ckpt_state.write_synced(tmp / name, data)
    for name in files:
        os.replace(tmp / name, out / name)
    tmp.rmdir()
    ckpt_state.fsync_dir(out)
    return out


def hf_config(config, dtype: str, eot_id: int) -> dict:
    """The config.json of `config`: Qwen3 with q/k norm, Llama without."""
    common = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling.to_dict() if config.rope_scaling is not None else None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": TORCH_DTYPE_NAMES[dtype],
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }
    if not config.qk_norm:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                "mlp_bias": False, "pretraining_tp": 1}
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **common,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": config.n_layers}


def safetensors_bytes(tensors: dict, dtype: str, metadata: dict | None = None) -> bytes:
    """Serialize float32 numpy arrays as one safetensors blob in `dtype` ("bf16" or "f32"), through
    the safetensors library's low-level serializer, which takes raw bfloat16 bits (numpy has no
    bfloat16 type, so safetensors.numpy cannot)."""
    from safetensors import TensorSpec, serialize

    encoded = {name: _encode(np.asarray(t, dtype=np.float32), dtype) for name, t in tensors.items()}
    specs = {name: TensorSpec(dtype=SAFETENSORS_DTYPES[dtype], shape=list(arr.shape), data_ptr=arr.ctypes.data,
                              data_len=arr.nbytes)
             for name, arr in encoded.items()}  # `encoded` keeps the buffers alive while serialize reads them
    meta = {str(k): str(v) for k, v in metadata.items()} if metadata else None
    return bytes(serialize(specs, metadata=meta))


def _encode(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as little-endian float32, or as bfloat16 bits (uint16) rounded to nearest,
    ties to even, like torch's conversion."""
    a = np.ascontiguousarray(a, dtype="<f4")
    if dtype == "f32":
        return a
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    rounded[np.isnan(a)] = 0x7FC0
    return rounded


def _json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
