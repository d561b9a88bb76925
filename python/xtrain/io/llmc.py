"""llm.c's GPT-2 model file (gpt2_124M.bin, float32; gpt2_124M_bf16.bin, bfloat16), read and written.

    model = llmc.load("gpt2_124M.bin", device="cuda", bf16=True)   # a GPT2 with its weights
    llmc.save("out.bin", model, dtype="bf16")                      # llm.c's train_gpt2cu reads it
    xtrain train --init-from gpt2_124M.bin --data DIR ...          # read_pretrained (GPT-2's tokenizer)

Layout (little-endian): a header of 256 int32 -- magic 20240326, version (3: float32 parameters,
5: bfloat16), max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size, zeros
-- then the parameters, one after the other in this order, each row-major:

    wte (Vp, C)  wpe (maxT, C)  ln1w (L, C)  ln1b (L, C)  qkvw (L, 3C, C)  qkvb (L, 3C)
    attprojw (L, C, C)  attprojb (L, C)  ln2w (L, C)  ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)
    fcprojw (L, C, 4C)  fcprojb (L, C)  lnfw (C)  lnfb (C)

Mapping: the linears are [out, in] as xtrain's (no transpose); qkvw's rows are q_proj, k_proj,
v_proj of models/gpt2.py, one after the other; wte's first vocab_size rows are wte.weight, the
padded rows wte.pad. Decisions:
- Everything is checked before a byte of weights is trusted: the magic, the version, positive
  sizes that agree (channels divisible by heads, padded >= vocab), and the file's length against
  the sizes the header implies; a bad file is a CheckpointError naming what is wrong.
- bfloat16 widens to float32 exactly; float32 -> bfloat16 rounds to nearest even (io.export's
  encoder), so a bf16 file read and written again is the same bytes.
- save() writes through a temporary file beside the target and renames it, so a failed write
  leaves the target as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from xtrain.io.export import _encode
from xtrain.io.state import CheckpointError, write_synced
from xtrain.models import GPT2, GPT2Config

MAGIC = 20240326
VERSIONS = {3: "f32", 5: "bf16"}
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
_ITEM = {"f32": 4, "bf16": 2}


def tensor_shapes(config: GPT2Config) -> list[tuple[str, tuple]]:
    """llm.c's parameter tensors in file order: (name, shape)."""
    C, L, Vp, T = config.dim, config.n_layers, config.padded_vocab_size, config.max_seq
    return [("wte", (Vp, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
            ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)),
            ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
            ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


# llm.c's per-layer tensors -> the block's parameter suffixes (qkv split three ways)
_PER_LAYER = {"ln1w": "ln_1.weight", "ln1b": "ln_1.bias", "attprojw": "attn.c_proj.weight",
              "attprojb": "attn.c_proj.bias", "ln2w": "ln_2.weight", "ln2b": "ln_2.bias",
              "fcw": "mlp.c_fc.weight", "fcb": "mlp.c_fc.bias", "fcprojw": "mlp.c_proj.weight",
              "fcprojb": "mlp.c_proj.bias"}
_QKV = ("q_proj", "k_proj", "v_proj")


def read(path) -> tuple[GPT2Config, dict, str]:
    """(config, our parameter name -> float32 array, "f32" or "bf16") of llm.c model file `path`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or e})") from None
    if header.size != HEADER_INTS or int(header[0]) != MAGIC:
        raise CheckpointError(f"{path}: not an llm.c GPT-2 model file (expected a 1024-byte header starting "
                              f"with magic {MAGIC})")
    version = int(header[1])
    if version not in VERSIONS:
        raise CheckpointError(f"{path}: llm.c model file version {version} (xtrain reads 3: float32, 5: bfloat16)")
    dtype = VERSIONS[version]
    max_seq, vocab, layers, heads, channels, padded = (int(v) for v in header[2:8])
    try:
        config = GPT2Config(vocab_size=vocab, dim=channels, n_layers=layers, n_heads=heads, max_seq=max_seq,
                            padded_vocab_size=padded)
    except ValueError as e:
        raise CheckpointError(f"{path}: its header describes no GPT-2 ({e})") from None
    shapes = tensor_shapes(config)
    numel = sum(int(np.prod(s)) for _, s in shapes)
    expected = HEADER_BYTES + numel * _ITEM[dtype]
    if size != expected:
        raise CheckpointError(f"{path}: {size} bytes, but its header ({layers} layers, {channels} channels, "
                              f"{padded} padded vocabulary, {max_seq} positions, {dtype}) implies {expected}")
    raw = np.fromfile(path, dtype="<f4" if dtype == "f32" else "<u2", offset=HEADER_BYTES)
    if dtype == "bf16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    flat, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        flat[name] = raw[off:off + n].astype(np.float32).reshape(shape)
        off += n
    return config, from_llmc(flat, config), dtype


def from_llmc(flat: dict, config: GPT2Config) -> dict:
    """llm.c's tensors (name -> array) as our parameters, in named_parameters() order."""
    C, V = config.dim, config.vocab_size
    out = {"wte.weight": flat["wte"][:V]}
    if config.padded_vocab_size > V:
        out["wte.pad"] = flat["wte"][V:]
    out["wpe.weight"] = flat["wpe"]
    for i in range(config.n_layers):
        for j, proj in enumerate(_QKV):
            out[f"h.{i}.attn.{proj}.weight"] = flat["qkvw"][i, j * C:(j + 1) * C]
            out[f"h.{i}.attn.{proj}.bias"] = flat["qkvb"][i, j * C:(j + 1) * C]
        for name, suffix in _PER_LAYER.items():
            out[f"h.{i}.{suffix}"] = flat[name][i]
    out["ln_f.weight"], out["ln_f.bias"] = flat["lnfw"], flat["lnfb"]
    return {name: np.ascontiguousarray(out[name]) for name in config.param_shapes()}


def to_llmc(params: dict, config: GPT2Config) -> list[np.ndarray]:
    """Our parameters (name -> array) as llm.c's tensors, in file order (the inverse of from_llmc;
    without wte.pad the padded rows are zeros, as llm.c's own export writes them)."""
    C, L = config.dim, config.n_layers
    pad = params.get("wte.pad")
    if pad is None:
        pad = np.zeros((config.padded_vocab_size - config.vocab_size, C), np.float32)
    flat = {"wte": np.concatenate([params["wte.weight"], pad]), "wpe": params["wpe.weight"]}
    flat["qkvw"] = np.stack([np.concatenate([params[f"h.{i}.attn.{p}.weight"] for p in _QKV]) for i in range(L)])
    flat["qkvb"] = np.stack([np.concatenate([params[f"h.{i}.attn.{p}.bias"] for p in _QKV]) for i in range(L)])
    for name, suffix in _PER_LAYER.items():
        flat[name] = np.stack([params[f"h.{i}.{suffix}"] for i in range(L)])
    flat["lnfw"], flat["lnfb"] = params["ln_f.weight"], params["ln_f.bias"]
    return [np.asarray(flat[name], dtype=np.float32).reshape(shape) for name, shape in tensor_shapes(config)]


def read_pretrained(path):
    """llm.c's model file as `xtrain train --init-from FILE` reads it: an hf_import.Pretrained
    with the config, the weights and GPT-2's tokenizer (tiktoken), the one llm.c's GPT-2 files are
    trained with; PretrainedError when that tokenizer is unavailable."""
    from xtrain.data import tokenizer as tokenizers
    from xtrain.data.errors import DataError
    from xtrain.models.hf_import import Pretrained, PretrainedError

    config, params, dtype = read(path)
    try:
        tok = tokenizers.gpt2_tokenizer()
    except DataError as e:
        raise PretrainedError(f"{path}: llm.c's GPT-2 model files use GPT-2's tokenizer: {e}") from None
    if tok.vocab_size > config.vocab_size:
        raise PretrainedError(f"{path}: GPT-2's tokenizer has ids up to {tok.vocab_size - 1}, beyond the model's "
                              f"vocab_size {config.vocab_size}")
    return Pretrained(Path(path), config, params, tok, "llm.c GPT-2", dtype)


def load(path, device: str = "cpu", **overrides) -> GPT2:
    """A GPT2 on `device` with the weights of llm.c model file `path`; `overrides` are config
    fields (bf16, recompute, dropout)."""
    config, params, _ = read(path)
    if overrides:
        config = GPT2Config.from_dict({**config.to_dict(), **overrides})
    model = GPT2(config, device=device)
    model.load_state_dict(params)
    return model


def save(path, model_or_params, config: GPT2Config | None = None, dtype: str = "f32") -> Path:
    """Write a GPT2 (or our parameter arrays with their config) as an llm.c model file in `dtype`
    ("f32": version 3, "bf16": version 5)."""
    if dtype not in _ITEM:
        raise ValueError(f"dtype must be f32 or bf16, got {dtype!r}")
    if isinstance(model_or_params, GPT2):
        config = model_or_params.config
        params = model_or_params.store.state_arrays()  # sync point: the weights come to the host
    else:
        params = model_or_params
        if not isinstance(config, GPT2Config):
            raise TypeError("save: pass a GPT2, or parameter arrays with their GPT2Config")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MAGIC, 3 if dtype == "f32" else 5, config.max_seq, config.vocab_size, config.n_layers,
                  config.n_heads, config.dim, config.padded_vocab_size]
    body = b"".join(_encode(t, dtype).tobytes() for t in to_llmc(params, config))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write_synced(tmp, header.tobytes() + body)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
