"""The schema of a checkpoint's state.json, checked in full before anything is allocated.

xtrain.io.state.load() runs check_state(meta) on the parsed JSON (every key, type and range); then
the size and sha256 of every listed file; then check_tensor_files(dir, meta), which reads the
safetensors headers (never the tensors) and requires exactly the tensors the config implies,
float32, with the implied shapes. A failure is a SchemaError (a ValueError) naming the field or
tensor; state.py adds the path (CheckpointError). (A prepared dataset's meta.json is checked by
xtrain.data itself, which imports nothing of the rest of xtrain.)

Invariants:
- Every file a checkpoint names is a plain file name (no directory part, no "..", not absolute,
  not hidden) of a known kind, listed in `files` with its size and sha256; state.py also requires
  it to be a regular file, not a symlink. Nothing else in a checkpoint directory is ever read.
- No number that sizes memory is trusted from state.json alone: the config must agree with the
  tensor headers, whose shapes must agree with the bytes on disk; the rest is range-checked here.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from xtrain.data.tokenizer import TOKENIZER_FILES
from xtrain.models import config_from_dict
from xtrain.models.transformer import RopeScaling
from xtrain.optim import state_layouts

MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optim.safetensors"
# Every file a tokenizer kind saves (TOKENIZER_FILES: kind -> its files, the main one first).
TOKENIZER_FILE_NAMES = tuple(sorted({n for names in TOKENIZER_FILES.values() for n in names}))
KNOWN_FILES = (MODEL_FILE, OPTIM_FILE, *TOKENIZER_FILE_NAMES)
# Far above any real checkpoint's (a few KB of JSON; headers of ~100 bytes per tensor), far below
# what would hurt to read.
MAX_STATE_BYTES = 16 << 20
MAX_HEADER_BYTES = 64 << 20
INT31 = 2**31 - 1
U64 = 2**64
_CONFIG_INTS = ("vocab_size", "dim", "n_layers", "n_heads", "head_dim", "ffn_dim", "max_seq")
_LOADER_INTS = ("version", "step", "seed", "seq", "global_batch", "n_tokens")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DEVICE = re.compile(r"cpu|cuda:\d{1,4}")


class SchemaError(ValueError):
    """state.json, or a tensor file's header, does not fit the checkpoint schema."""


# ---- state.json

def check_state(meta) -> None:
    """SchemaError unless `meta` (parsed state.json) fits the schema; see the module doc."""
    _require(isinstance(meta, dict), "the top level must be a JSON object")
    required = {"format", "version", "step", "config", "rng", "files"}
    optional = {"optimizer", "rank_rng", "data", "dataset", "tokenizer", "train_args"}
    missing = sorted(required - set(meta))
    unknown = sorted(set(meta) - required - optional)
    _require(not missing, f"missing keys {missing}")
    _require(not unknown, f"unknown keys {unknown[:8]}")
    _int(meta["step"], "step", 0, 2**63 - 1)
    config = meta["config"]
    check_config(config)
    _check_optimizer(meta.get("optimizer"), config)
    _check_rng(meta["rng"], meta.get("rank_rng"))
    _check_loader(meta.get("data"))
    _require(meta.get("dataset") is None or isinstance(meta["dataset"], str),
             "dataset must be a string or null")
    _check_tokenizer(meta.get("tokenizer"))
    train_args = meta.get("train_args")
    _require(train_args is None or isinstance(train_args, dict), "train_args must be an object or null")
    if train_args and train_args.get("lr") is not None:
        _float(train_args["lr"], "train_args.lr", lo=0.0, lo_open=True)
    _check_files(meta)


def check_config(config) -> None:
    _require(isinstance(config, dict), "config must be an object")
    if "arch" in config:  # an architecture of the registry other than the Qwen3-style default
        _check_arch_config(config)
        return
    for name in _CONFIG_INTS:
        _require(name in config, f"config.{name} is missing")
        _int(config[name], f"config.{name}", 1, INT31)
    _require(config["head_dim"] % 2 == 0, f"config.head_dim must be even, got {config['head_dim']}")
    for name in ("rope_theta", "norm_eps"):
        if name in config:
            _float(config[name], f"config.{name}", lo=0.0, lo_open=True)
    for name in ("bf16", "recompute", "tie_embeddings", "qk_norm", "doc_rope", "fp8", "lean_activations"):
        if name in config:
            _require(isinstance(config[name], bool), f"config.{name} must be true or false")
    if config.get("n_kv_heads") is not None:  # absent in older checkpoints: n_heads
        _int(config["n_kv_heads"], "config.n_kv_heads", 1, INT31)
        _require(config["n_heads"] % config["n_kv_heads"] == 0,
                 f"config.n_kv_heads ({config['n_kv_heads']}) must divide n_heads ({config['n_heads']})")
    if "dropout" in config:
        _float(config["dropout"], "config.dropout", lo=0.0, hi=1.0, hi_open=True)
    if config.get("doc_sep") is not None:  # attention within documents (absent or null: off)
        _int(config["doc_sep"], "config.doc_sep", 0, config["vocab_size"] - 1)
    if config.get("rope_scaling") is not None:  # Llama 3's RoPE scaling (absent or null: plain RoPE)
        try:
            RopeScaling.from_dict(config["rope_scaling"])
        except (TypeError, ValueError) as e:
            raise SchemaError(f"config.rope_scaling: {e}") from None
    unknown = sorted(set(config) - set(_CONFIG_INTS) - {"rope_theta", "norm_eps", "bf16", "recompute",
                                                        "dropout", "n_kv_heads", "tie_embeddings", "qk_norm",
                                                        "doc_sep", "rope_scaling", "doc_rope", "fp8",
                                                        "lean_activations"})
    _require(not unknown, f"config has unknown fields {unknown[:8]}")


def _check_arch_config(config: dict) -> None:
    """A config record naming its architecture (GPT-2's): its sizes bounded like the Qwen3 record's,
    then the config class's own checks."""
    for name, value in config.items():
        if isinstance(value, int) and not isinstance(value, bool):
            _int(value, f"config.{name}", 0, INT31)
    try:
        config_from_dict(config)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"config: {e}") from None


def param_shapes(config: dict) -> dict:
    """name -> shape of every parameter of a TinyTransformer with this (checked) config."""
    return _model_config(config).param_shapes()


def param_count(config: dict) -> int:
    """len(param_shapes(config)), without building it."""
    return _model_config(config).param_count()


def _model_config(config: dict):
    return config_from_dict(config)  # the model's own shapes, not a copy of them


def _check_optimizer(opt, config) -> None:
    if opt is None:
        return
    _require(isinstance(opt, dict), "optimizer must be an object or null")
    for key in ("step", "hyper", "names"):
        _require(key in opt, f"optimizer.{key} is missing")
    _int(opt["step"], "optimizer.step", 0, 2**63 - 1)
    hyper = opt["hyper"]
    _require(isinstance(hyper, dict), "optimizer.hyper must be an object")
    for key in ("lr", "betas", "eps", "weight_decay"):
        _require(key in hyper, f"optimizer.hyper.{key} is missing")
    _float(hyper["lr"], "optimizer.hyper.lr", lo=0.0)
    betas = hyper["betas"]
    _require(isinstance(betas, list) and len(betas) == 2, "optimizer.hyper.betas must be a list of two numbers")
    for b in betas:
        _float(b, "optimizer.hyper.betas[]", lo=0.0, hi=1.0, hi_open=True)
    _float(hyper["eps"], "optimizer.hyper.eps", lo=0.0, lo_open=True)
    _float(hyper["weight_decay"], "optimizer.hyper.weight_decay", lo=0.0)
    names = opt["names"]
    _require(isinstance(names, list) and all(isinstance(n, str) for n in names),
             "optimizer.names must be a list of strings")
    _require(len(names) == param_count(config) and set(names) == set(param_shapes(config)),
             "optimizer.names are not the model's parameter names")
    _require(hyper.get("optimizer", "adamw") in ("adamw", "muon"),
             "optimizer.hyper.optimizer must be \"adamw\" or \"muon\"")
    if hyper.get("optimizer") == "muon":  # its matrices name optim.safetensors' tensors
        muon = hyper.get("muon")
        _require(isinstance(muon, dict), "optimizer.hyper.muon must be an object")
        matrices = muon.get("matrices")
        _require(isinstance(matrices, list) and all(isinstance(n, str) for n in matrices)
                 and len(set(matrices)) == len(matrices) and set(matrices) <= set(names),
                 "optimizer.hyper.muon.matrices must list distinct parameter names")


def _check_rng(rng, rank_rng) -> None:
    _require(isinstance(rng, dict) and "cpu" in rng, "rng must be an object with a 'cpu' entry")
    for device, state in rng.items():
        _require(_DEVICE.fullmatch(device) is not None, f"rng has an unknown device {device!r}")
        _generator_state(state, f"rng.{device}")
    if rank_rng is not None:
        _require(isinstance(rank_rng, list), "rank_rng must be a list or null")
        for i, state in enumerate(rank_rng):
            _generator_state(state, f"rank_rng[{i}]")


def _generator_state(state, where: str) -> None:
    _require(isinstance(state, list) and len(state) == 2, f"{where} must be [seed, offset]")
    for v in state:
        _int(v, where, 0, U64 - 1)


def _check_loader(data) -> None:
    # The loader's own load_state_dict checks the values against its shard; here only the types,
    # of the keys present (the loader's format belongs to xtrain.data).
    if data is None:
        return
    _require(isinstance(data, dict), "data must be an object or null")
    for key in _LOADER_INTS:
        if key in data:
            _int(data[key], f"data.{key}", 0, U64 - 1)
    if "fingerprint" in data:
        _require(isinstance(data["fingerprint"], str), "data.fingerprint must be a string")
    if "bit_generator" in data:
        _require(isinstance(data["bit_generator"], dict), "data.bit_generator must be an object")


def _check_tokenizer(tok) -> None:
    if tok is None:
        return
    _require(isinstance(tok, dict), "tokenizer must be an object or null")
    for key in ("kind", "name", "file", "fingerprint", "vocab_size", "eot_id"):
        _require(key in tok, f"tokenizer.{key} is missing")
    _require(isinstance(tok["kind"], str) and tok["kind"] in TOKENIZER_FILES,
             f"tokenizer.kind must be one of {sorted(TOKENIZER_FILES)}")
    main = TOKENIZER_FILES[tok["kind"]][0]
    _require(tok["file"] == main, f"tokenizer.file must be {main!r} for a {tok['kind']} tokenizer")
    _require(isinstance(tok["name"], str), "tokenizer.name must be a string")
    _require(isinstance(tok["fingerprint"], str) and _HEX32.fullmatch(tok["fingerprint"]) is not None,
             "tokenizer.fingerprint must be 32 hex digits")
    _int(tok["vocab_size"], "tokenizer.vocab_size", 1, 2**32 - 1)
    _int(tok["eot_id"], "tokenizer.eot_id", 0, tok["vocab_size"] - 1)


def _check_files(meta) -> None:
    files = meta["files"]
    _require(isinstance(files, dict), "files must be an object")
    for name, rec in files.items():
        check_plain_name(name, "files")
        _require(name in KNOWN_FILES, f"files lists {name!r}, which is not a checkpoint file")
        _require(isinstance(rec, dict) and set(rec) == {"bytes", "sha256"},
                 f"files.{name} must be {{bytes, sha256}}")
        _int(rec["bytes"], f"files.{name}.bytes", 0, 2**63 - 1)
        _require(isinstance(rec["sha256"], str) and _HEX64.fullmatch(rec["sha256"]) is not None,
                 f"files.{name}.sha256 must be 64 hex digits")
    wanted = {MODEL_FILE}
    if meta.get("optimizer") is not None:
        wanted.add(OPTIM_FILE)
    if meta.get("tokenizer") is not None:
        wanted.update(TOKENIZER_FILES[meta["tokenizer"]["kind"]])
    _require(set(files) == wanted, f"files must list exactly {sorted(wanted)}, got {sorted(files)}")


def check_plain_name(name, where: str) -> None:
    """SchemaError unless `name` is a plain file name: no directory part, not '.', '..' or
    hidden, no NUL."""
    ok = (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\\" not in name
          and "\0" not in name and not name.startswith("."))
    _require(ok, f"{where}: {name!r} is not a plain file name inside the directory")


# ---- tensor files

def check_tensor_files(directory, meta) -> None:
    """SchemaError unless model.safetensors (and optim.safetensors) hold exactly the float32
    tensors `meta`'s config implies. Reads headers only; call after the sizes are verified."""
    directory = Path(directory)
    config = meta["config"]
    model = read_header(directory / MODEL_FILE)
    _require(len(model) == param_count(config),
             f"{MODEL_FILE} holds {len(model)} tensors; the config implies {param_count(config)}")
    shapes = param_shapes(config)
    _check_tensors(MODEL_FILE, model, shapes)
    if meta.get("optimizer") is not None:
        optim = read_header(directory / OPTIM_FILE)
        layouts = state_layouts(meta["optimizer"]["hyper"], shapes)  # the newest first
        moments = next((layout for layout in layouts if set(layout) == set(optim)), layouts[0])
        _require(len(optim) == len(moments),
                 f"{OPTIM_FILE} holds {len(optim)} tensors; the config implies {len(moments)}")
        _check_tensors(OPTIM_FILE, optim, moments)


def read_header(path) -> dict:
    """name -> (dtype, shape, (begin, end)) from a safetensors file's header, bounds-checked
    against the file's size (the library would check too, but only while loading everything)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        _require(len(head) == 8, f"{path.name} is too short to be a safetensors file")
        n = int.from_bytes(head, "little")
        _require(n <= min(size - 8, MAX_HEADER_BYTES), f"{path.name} has an impossible header length {n}")
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError):
            raise SchemaError(f"{path.name} has an unreadable header") from None
    _require(isinstance(header, dict), f"{path.name} has an unreadable header")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - n
    out = {}
    for name, info in header.items():
        where = f"{path.name}: tensor {name[:80]!r}"
        _require(isinstance(info, dict) and {"dtype", "shape", "data_offsets"} <= set(info), f"{where} is malformed")
        shape, offsets = info["shape"], info["data_offsets"]
        _require(isinstance(shape, list) and all(_is_int(d) and 0 <= d <= 2**62 for d in shape),
                 f"{where} has a malformed shape")
        _require(isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
                 and 0 <= offsets[0] <= offsets[1] <= data_bytes, f"{where} lies outside the file")
        out[name] = (info["dtype"], tuple(shape), tuple(offsets))
    return out


def _check_tensors(file: str, header: dict, shapes: dict) -> None:
    for name, shape in shapes.items():
        _require(name in header, f"{file} lacks tensor {name!r}")
        dtype, got, (begin, end) = header[name]
        _require(dtype == "F32", f"{file}: {name} is {dtype}, expected F32")
        _require(got == shape, f"{file}: {name} has shape {list(got)}, the config implies {list(shape)}")
        _require(end - begin == 4 * math.prod(shape), f"{file}: {name} has {end - begin} bytes for shape {list(shape)}")


# ---- primitives

def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SchemaError(message)


def _is_int(v) -> bool:
    return type(v) is int  # not bool, not float


def _int(v, where: str, lo: int, hi: int) -> None:
    _require(_is_int(v) and lo <= v <= hi, f"{where} must be an integer in [{lo}, {hi}], got {_show(v)}")


def _float(v, where: str, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    left = "(" if lo_open else "["
    right = ")" if hi_open else "]"
    bounds = f" in {left}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}{right}"
    _require(ok, f"{where} must be a finite number{bounds}, got {_show(v)}")


def _show(v) -> str:
    if _is_int(v) and v.bit_length() > 128:
        return f"an integer of {v.bit_length()} bits"
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."
