"""Import a Hugging Face Qwen3 or Llama model directory as a TinyTransformer.

    model = TinyTransformer.from_pretrained("Qwen/Qwen3-0.6B", device="cuda", bf16=True)
    xtrain train --init-from Qwen/Qwen3-0.6B --data corpus.txt ...   # or a local directory

    DIR/config.json                      Qwen3ForCausalLM or LlamaForCausalLM (architectures, else
                                         model_type qwen3 / llama)
    DIR/model.safetensors                the weights (F32, BF16 or F16), or
    DIR/model.safetensors.index.json     + the shards it names (save_pretrained(max_shard_size=...))
    DIR/tokenizer.json | tokenizer.model the tokenizer (optional for from_pretrained; --init-from
                                         needs it), with tokenizer_config.json's eos_token

Mapping (the inverse of xtrain.io.export): the Hugging Face names are ours with a "model." prefix
(lm_head.weight as it is); no weight is permuted, because both models use rotate-half RoPE on the
same head layout. Config: hidden_size -> dim, num_hidden_layers -> n_layers, num_attention_heads
-> n_heads, num_key_value_heads -> n_kv_heads, head_dim (default hidden_size / heads) -> head_dim,
intermediate_size -> ffn_dim, max_position_embeddings -> max_seq, rope theta (rope_theta, or
rope_parameters.rope_theta in transformers >= 5) -> rope_theta, rope_scaling (or rope_parameters)
of rope_type "llama3" -> rope_scaling (factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings: Llama 3's frequency scaling), rms_norm_eps -> norm_eps,
tie_word_embeddings -> tie_embeddings, and qk_norm on for Qwen3, off for Llama.

Decisions:
- Anything the model cannot represent is refused with a PretrainedError naming it, never dropped:
  another architecture, a RoPE scaling other than llama3's, attention or MLP biases, a sliding window, experts (MoE), an
  activation other than SiLU, a head_dim above the attention kernels' 256, a missing, unexpected
  or misshapen tensor. Only RoPE's cached inverse frequencies (rotary_emb.inv_freq), which some
  older files carry, are skipped: they are a function of the config.
- Tensors are read from the safetensors headers' offsets (read_header checks them against the
  file's size) rather than through safetensors.numpy, which has no bfloat16; BF16 and F16 widen to
  float32 exactly, so an import then export in the source dtype gives the same bits.
- This module knows the Hugging Face side only: the model and config classes are passed in
  (TinyTransformer.from_pretrained, xtrain.trainer.train), so xtrain.models does not depend on it through
  a cycle; xtrain.io.export takes its name mapping (hf_name) from here.
- A tied model (tie_word_embeddings) has no lm_head tensor; one that is present anyway must equal
  the embedding (transformers would overwrite it).
- Nothing is sized from an unchecked number: config.json and the index are read only when they
  are regular files within xtrain.data.bounded's limits; the config's integers must be positive
  and at most 2**31 - 1 (what a checkpoint may record, so the run it starts stays loadable), its
  floats finite; the tensor count the config implies is compared with the headers' before any
  per-layer table is built; the headers are bounded, their byte ranges inside the file and not
  overlapping; and every weight must be finite.
- A name that is not a local directory but reads as a hub model id (NAME or ORG/NAME) is
  downloaded once through huggingface_hub's snapshot_download into the hub's cache ($HF_HOME),
  only the files read here (HUB_FILES: no pickles, no other formats), and read from there
  (resolve_pretrained). Offline (the hub's host does not answer, or HF_HUB_OFFLINE) it is read from
  the cache alone; what cannot be had -- huggingface_hub missing, a model neither cached nor
  reachable, one the hub does not have -- is one PretrainedError saying what to do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from xtrain.data.bounded import MAX_HEADER_BYTES, MAX_JSON_BYTES, read_text_bounded

from . import hf_gpt2

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# architectures name -> model_type, and whether it has the per-head q/k RMSNorm
ARCHITECTURES = {"Qwen3ForCausalLM": ("qwen3", True), "LlamaForCausalLM": ("llama", False)}
MODEL_TYPES = {t: (a, qk) for a, (t, qk) in ARCHITECTURES.items()}
# The flash-attention kernels' largest head dimension (csrc/ops/flash_attention.cpp).
MAX_HEAD_DIM = 256
# Tensors that are a function of the config, present in some older files: skipped.
SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)
_WIDEN = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
# What a hub model's download fetches: the config, the weights (one file, or the shards and their
# index) and the tokenizer's files (read_tokenizer; tokenizer_config.json names the end of text).
HUB_FILES = (CONFIG_FILE, "*.safetensors", INDEX_FILE, "tokenizer.json", "tokenizer.model",
             "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
# A hub model id: NAME or ORG/NAME, each part letters, digits, '-', '_', '.' (not leading).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
HUB_INSTALL_HINT = "pip install 'xtrain[hub]' (or: pip install huggingface_hub)"
# The largest integer a config field may hold: a checkpoint's schema takes no more.
MAX_CONFIG_INT = 2**31 - 1


class PretrainedError(ValueError):
    """A Hugging Face directory that is missing, malformed, or holds a model xtrain cannot
    represent; the message names what."""


@dataclass
class Pretrained:
    """What a Hugging Face directory holds, read and checked: the model config (run options at
    their defaults), our parameter name -> float32 array, the tokenizer (or None), and the
    architecture and source dtype."""
    path: Path
    config: object  # a TransformerConfig
    tensors: dict
    tokenizer: object
    architecture: str
    dtype: str  # "f32", "bf16" or "f16": the dtype of the weights on disk

    def build(self, model_cls, device: str = "cpu", **overrides):
        """model_cls (TinyTransformer) with these weights on `device`; `overrides` are config fields
        (bf16, recompute, dropout, max_seq)."""
        import xtrain

        config = type(self.config).from_dict({**self.config.to_dict(), **overrides})
        with xtrain.no_grad():
            model = model_cls(config, device=device)
        model.load_state_dict(self.tensors, strict=True)
        model.tokenizer = self.tokenizer
        return model


def hf_name(name: str) -> str:
    """Our parameter name -> the Hugging Face (Qwen3 / Llama) name."""
    return name if name.startswith("lm_head.") else "model." + name


def read_pretrained(path, config_cls, tokenizer: bool = True) -> Pretrained:
    """Read and check a Hugging Face directory (see the module doc) into a config of `config_cls`
    (TransformerConfig; or a dict {"qwen3": TransformerConfig, "gpt2": GPT2Config}: the one of the
    directory's architecture) and its tensors; PretrainedError on anything xtrain cannot load.
    tokenizer=False skips the tokenizer. `path` may be a hub model id (resolve_pretrained)."""
    path = resolve_pretrained(path)
    hf = read_hf_config(path)
    classes = config_cls if isinstance(config_cls, dict) else {"qwen3": config_cls}
    if hf_gpt2.is_gpt2(hf):  # GPT-2 has a mapping of its own (models/hf_gpt2.py)
        if "gpt2" not in classes:
            raise PretrainedError(f"{path}: a GPT-2 model ({hf_gpt2.ARCHITECTURE}); GPT2.from_pretrained reads it")
        return _read_gpt2(path, hf, classes["gpt2"], tokenizer)
    if "qwen3" not in classes:
        raise PretrainedError(f"{path}: not a GPT-2 model ({hf.get('architectures') or hf.get('model_type')}); "
                              f"TinyTransformer.from_pretrained reads Qwen3 and Llama")
    config_cls = classes["qwen3"]
    arch, config = config_from_hf(hf, path / CONFIG_FILE, config_cls)
    raw, dtype = read_weights(path)
    tensors = match_tensors(raw, config, path)
    tok = read_tokenizer(path, config.vocab_size) if tokenizer else None
    return Pretrained(path, config, tensors, tok, arch, dtype)


def _read_gpt2(path: Path, hf: dict, config_cls, tokenizer: bool) -> Pretrained:
    """read_pretrained of a GPT-2 directory: hf_gpt2's config and tensor mapping."""
    def error(message: str):
        raise PretrainedError(message)

    config = hf_gpt2.config_from_hf(hf, path / CONFIG_FILE, error, config_cls)
    raw, dtype = read_weights(path)
    tensors = hf_gpt2.params_from_hf(raw, config, path, error)
    tok = read_tokenizer(path, config.vocab_size) if tokenizer else None
    return Pretrained(path, config, tensors, tok, hf_gpt2.ARCHITECTURE, dtype)


# ---- where the model is

def resolve_pretrained(name) -> Path:
    """The local directory `name` names: itself when it is one, else the snapshot of the hub model
    `name` (ORG/NAME), downloaded into the Hugging Face cache unless it is there (HUB_FILES only).
    PretrainedError in one line for what cannot be had, saying what to do."""
    path = Path(name)
    if path.is_dir() or (path.is_file() and path.suffix == ".bin"):  # or llm.c's model file (xtrain.io.llmc)
        return path
    text = str(name)
    if path.exists() or not _HUB_ID.fullmatch(text) or ".." in text or "--" in text:
        raise PretrainedError(f"{name}: no such directory (expected a Hugging Face model directory with "
                              f"{CONFIG_FILE} and {WEIGHTS_FILE}, or a hub model name such as Qwen/Qwen3-0.6B)")
    local = "download the model folder and pass its path instead"
    try:
        import huggingface_hub
    except ImportError:
        raise PretrainedError(f"{name} is not a local directory; downloading it from the Hugging Face hub needs "
                              f"huggingface_hub, which is not installed: {HUB_INSTALL_HINT}, or {local}") from None
    try:
        from huggingface_hub import errors
    except ImportError:  # huggingface_hub before 0.23 kept its errors in utils
        from huggingface_hub import utils as errors
    from xtrain.data.hub import hub_cache, hub_offline, hub_reachable

    online = hub_reachable()  # False too under HF_HUB_OFFLINE: the cache alone, no retries
    try:
        return Path(huggingface_hub.snapshot_download(text, allow_patterns=list(HUB_FILES),
                                                      local_files_only=not online))
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        cache = hub_cache()
        if hub_offline():
            why, fix = "HF_HUB_OFFLINE is set", "unset HF_HUB_OFFLINE to download it"
        else:
            why, fix = ("the Hugging Face hub is unreachable (offline?)",
                        f"run the same command where the hub can be reached and copy {cache} here")
        raise PretrainedError(f"cannot download {name}: {why} and it is not in the cache {cache}; {fix}, "
                              f"or {local}") from None
    except errors.GatedRepoError:
        raise PretrainedError(f"{name} is gated on the Hugging Face hub: accept its terms on its page and log in "
                              f"(hf auth login), or {local}") from None
    except errors.RepositoryNotFoundError:
        hint = "" if "/" in text else "; hub names are ORG/NAME, e.g. Qwen/Qwen3-0.6B"
        raise PretrainedError(f"{name}: no such directory here, and no model {name} on the Hugging Face hub (or "
                              f"it is private: log in with hf auth login){hint}") from None
    except errors.HfHubHTTPError as e:
        raise PretrainedError(f"could not download {name} from the Hugging Face hub: "
                              f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None


# ---- config

def read_hf_config(path: Path) -> dict:
    f = path / CONFIG_FILE
    if not f.is_file():
        raise PretrainedError(f"{path}: no {CONFIG_FILE} (expected a Hugging Face model directory)")
    text = read_text_bounded(f, MAX_JSON_BYTES, "model config", PretrainedError)
    try:
        hf = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise PretrainedError(f"{f}: invalid JSON ({_first_line(e)})") from None
    if not isinstance(hf, dict):
        raise PretrainedError(f"{f}: expected a JSON object")
    return hf


def config_from_hf(hf: dict, source, config_cls) -> tuple:
    """(architecture, config_cls config) of a Hugging Face config.json dict, or PretrainedError
    naming the first thing xtrain's model does not have."""
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if archs:
        if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
            raise PretrainedError(f"{source}: architecture {archs} is not supported (xtrain imports "
                               f"{' and '.join(ARCHITECTURES)})")
        arch = archs[0]
    elif model_type in MODEL_TYPES:
        arch = MODEL_TYPES[model_type][0]
    else:
        raise PretrainedError(f"{source}: model_type {model_type!r} is not supported (xtrain imports "
                           f"{' and '.join(ARCHITECTURES)})")
    kind, qk_norm = ARCHITECTURES[arch]

    def unsupported(what: str):
        raise PretrainedError(f"{source}: {what} is not supported by xtrain's model ({arch})")

    act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
    if act != "silu":
        unsupported(f"hidden_act {act!r} (only silu: the SwiGLU MLP)")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            unsupported(f"{key} = true (the model has no biases)")
    if hf.get("use_sliding_window") or (kind != "qwen3" and hf.get("sliding_window")):
        unsupported(f"sliding-window attention (sliding_window {hf.get('sliding_window')})")
    layer_types = hf.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        unsupported(f"layer_types {sorted(set(layer_types))} (only full_attention)")
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if hf.get(key):
            unsupported(f"mixture of experts ({key} = {hf[key]})")
    theta, llama3 = _rope(hf, unsupported, source)
    ints = {}
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        ints[key] = _config_int(hf.get(key), key, source)
    heads = ints["num_attention_heads"]
    kv_heads = _config_int(hf.get("num_key_value_heads") or heads, "num_key_value_heads", source)
    head_dim = hf.get("head_dim") or ints["hidden_size"] // heads
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim % 2 or not 0 < head_dim <= MAX_HEAD_DIM:
        unsupported(f"head_dim {_shown(head_dim)} (it must be even and at most {MAX_HEAD_DIM})")
    if heads % kv_heads:
        raise PretrainedError(f"{source}: num_key_value_heads {kv_heads} must divide num_attention_heads {heads}")
    max_seq = _config_int(hf.get("max_position_embeddings") or 2048, "max_position_embeddings", source)
    floats = {key: _config_float(v, key, source) for key, v in
              (("rope_theta", theta), ("rms_norm_eps", hf.get("rms_norm_eps", 1e-6)))}
    tie = hf.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise PretrainedError(f"{source}: tie_word_embeddings must be true or false, got {_shown(tie)}")
    try:
        config = config_cls(
            vocab_size=ints["vocab_size"], dim=ints["hidden_size"], n_layers=ints["num_hidden_layers"],
            n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim, ffn_dim=ints["intermediate_size"],
            max_seq=max_seq, rope_theta=floats["rope_theta"], norm_eps=floats["rms_norm_eps"],
            tie_embeddings=tie, qk_norm=qk_norm, rope_scaling=llama3,
            # the lean ops at the published models' widths (1024 and up: Qwen3-0.6B and larger,
            # Llama-3.2-1B), as their presets; smaller models keep the plain blocks
            **({"lean_activations": ints["hidden_size"] >= 1024}
               if "lean_activations" in {f.name for f in fields(config_cls)} else {}))
    except (TypeError, ValueError) as e:
        raise PretrainedError(f"{source}: {e}") from None
    return arch, config


def _config_int(v, key: str, source) -> int:
    """A config.json integer: positive and at most MAX_CONFIG_INT, else PretrainedError."""
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_CONFIG_INT:
        raise PretrainedError(f"{source}: {key} must be an integer in [1, {MAX_CONFIG_INT}], got {_shown(v)}")
    return v


def _config_float(v, key: str, source) -> float:
    """A config.json number: finite and positive, else PretrainedError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise PretrainedError(f"{source}: {key} must be a finite positive number, got {_shown(v)}")
    return float(v)


def _shown(v) -> str:
    """A value of an untrusted file, short: a huge integer by its size, long text cut."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _rope(hf: dict, unsupported, source) -> tuple:
    """RoPE's base and scaling from rope_theta and rope_scaling, or rope_parameters (transformers
    >= 5): (theta, None) for plain RoPE, (theta, the llama3 fields) for rope_type "llama3"; any
    other rope type refused."""
    scaling = hf.get("rope_scaling")
    params = hf.get("rope_parameters")
    llama3 = None
    for what, p in (("rope_scaling", scaling), ("rope_parameters", params)):
        if p is None:
            continue
        if not isinstance(p, dict):
            unsupported(f"{what} {_shown(p)}")
        kind = p.get("rope_type", p.get("type", "default"))
        if kind == "llama3":
            llama3 = _llama3_fields(p, what, hf, source)
        elif kind != "default":
            unsupported(f"RoPE scaling ({what}.rope_type {_shown(kind)}; xtrain implements 'default' and 'llama3')")
    theta = hf.get("rope_theta")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return (10000.0 if theta is None else theta), llama3


def _llama3_fields(p: dict, what: str, hf: dict, source) -> dict:
    """The llama3 scaling's fields of rope_scaling / rope_parameters, checked: factor,
    low_freq_factor, high_freq_factor (finite numbers) and original_max_position_embeddings (an
    integer; transformers falls back to max_position_embeddings when it is absent)."""
    fields = {}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if key not in p:
            raise PretrainedError(f"{source}: {what} of rope_type 'llama3' has no {key}")
        fields[key] = _config_float(p[key], f"{what}.{key}", source)
    old = p.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
    fields["original_max_position_embeddings"] = _config_int(old, f"{what}.original_max_position_embeddings", source)
    return fields


# ---- weights

def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a directory: the shards the index names, else model.safetensors."""
    index = path / INDEX_FILE
    if index.is_file():
        text = read_text_bounded(index, MAX_JSON_BYTES, "safetensors index", PretrainedError)
        try:
            weight_map = json.loads(text)["weight_map"]
            values = list(weight_map.values())
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise PretrainedError(f"{index}: not a safetensors index ({type(e).__name__}: {_first_line(e)})") from None
        if not all(isinstance(n, str) for n in values):
            raise PretrainedError(f"{index}: weight_map must map tensor names to shard file names")
        names = sorted(set(values))
        for n in names:
            if not isinstance(n, str) or Path(n).name != n or not (path / n).is_file():
                raise PretrainedError(f"{index} names shard {n!r}, which is not a file in {path}")
        return [path / n for n in names]
    single = path / WEIGHTS_FILE
    if single.is_file():
        return [single]
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise PretrainedError(f"{path}: only PyTorch pickle weights (*.bin, *.pt); xtrain reads safetensors "
                           f"only (save with save_pretrained(..., safe_serialization=True))")
    raise PretrainedError(f"{path}: no {WEIGHTS_FILE} and no {INDEX_FILE}")


def read_weights(path: Path) -> tuple[dict, str]:
    """(Hugging Face name -> float32 array, the source dtype) from every weight file of `path`."""
    out, dtypes = {}, set()
    for f in weight_files(path):
        header, data_start = read_header(f)
        _refuse_overlaps(f, header)
        raw = np.memmap(f, dtype=np.uint8, mode="r", offset=data_start) if f.stat().st_size > data_start else None
        for name, (dtype, shape, (begin, end)) in header.items():
            if dtype not in _WIDEN:
                raise PretrainedError(f"{f}: tensor {name} is {dtype}; xtrain imports F32, BF16 and F16 weights")
            if name in out:
                raise PretrainedError(f"{path}: tensor {name} is stored twice")
            if end - begin != _WIDEN[dtype].itemsize * math.prod(shape):
                raise PretrainedError(f"{f}: tensor {name} has {end - begin} bytes for shape {list(shape)}")
            a = _widen(raw, begin, dtype, shape)
            if not np.isfinite(a).all():
                raise PretrainedError(f"{f}: tensor {name} holds {a.size - int(np.count_nonzero(np.isfinite(a)))} "
                                      f"non-finite values (NaN or Inf); refusing to train from it")
            out[name] = a
            dtypes.add(dtype)
    source = "f32" if dtypes <= {"F32"} else ("bf16" if "BF16" in dtypes else "f16")
    return out, source


def read_header(f: Path) -> tuple[dict, int]:
    """(name -> (dtype, shape, (begin, end)), the data section's offset) of a safetensors file,
    each tensor's bytes checked to lie inside the file."""
    size = f.stat().st_size

    def bad(why: str):
        raise PretrainedError(f"{f}: not a readable safetensors file ({why})")

    with open(f, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 <= n <= min(size - 8, MAX_HEADER_BYTES):
            bad("too short, or an impossible header length")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, RecursionError):
            bad("an unreadable header")
    if not isinstance(header, dict):
        bad("an unreadable header")
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            ok = all(isinstance(d, int) and d >= 0 for d in (*shape, begin, end)) and begin <= end <= size - 8 - n
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            bad(f"tensor {name[:80]!r} is malformed or lies outside the file")
        out[name] = (dtype, shape, (begin, end))
    return out, 8 + n


def _refuse_overlaps(f: Path, header: dict) -> None:
    """PretrainedError when two tensors of one file share bytes (a crafted file: the library
    refuses it too, and a model whose weights alias each other is no model)."""
    spans = sorted((begin, end, name) for name, (_, _, (begin, end)) in header.items() if end > begin)
    for (_, end, name), (begin, _, other) in zip(spans, spans[1:]):
        if begin < end:
            raise PretrainedError(f"{f}: not a readable safetensors file (tensors {name[:80]!r} and "
                                  f"{other[:80]!r} overlap)")


def _widen(raw, begin: int, dtype: str, shape) -> np.ndarray:
    """The tensor at byte `begin` of the data section `raw` as a float32 array, exactly (bf16 is
    the top half of a float32)."""
    n = math.prod(shape)
    a = np.frombuffer(raw, dtype=_WIDEN[dtype], count=n, offset=begin) if n else np.zeros(0, _WIDEN[dtype])
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32).reshape(shape)


def match_tensors(raw: dict, config, path: Path) -> dict:
    """Our name -> array for every parameter of `config` (a TransformerConfig), checked: every
    tensor present with its shape, nothing left over (PretrainedError naming the tensors)."""
    stored = sum(1 for name in raw if not name.endswith(SKIPPED_SUFFIXES))
    # Before param_shapes(), which has an entry per tensor: a config implying far more tensors than
    # the files hold is refused here (a few missing ones are named below).
    if config.param_count() > 2 * stored + 16:
        raise PretrainedError(f"{path}: the config implies {config.param_count():,} tensors "
                              f"({config.n_layers:,} layers); the weight files hold {stored}")
    shapes = config.param_shapes()
    wanted = {hf_name(n): n for n in shapes}  # Hugging Face name -> ours
    ours, extra = {}, []
    for name, a in raw.items():
        if name.endswith(SKIPPED_SUFFIXES):
            continue
        if name == "lm_head.weight" and config.tie_embeddings:
            emb = raw.get("model.embed_tokens.weight")
            if emb is None or emb.shape != a.shape or not np.array_equal(emb, a):
                raise PretrainedError(f"{path}: tie_word_embeddings is true but lm_head.weight differs from "
                                      f"model.embed_tokens.weight")
            continue
        if name not in wanted:
            extra.append(name)
            continue
        mine = wanted[name]
        if tuple(a.shape) != tuple(shapes[mine]):
            raise PretrainedError(f"{path}: tensor {name} has shape {list(a.shape)}; the config implies "
                                  f"{list(shapes[mine])}")
        ours[mine] = a
    if extra:
        raise PretrainedError(f"{path}: tensors that xtrain's {'Qwen3' if config.qk_norm else 'Llama'} layout "
                              f"has no place for (biases? another architecture?): "
                              f"{', '.join(sorted(extra)[:6])}{' ...' if len(extra) > 6 else ''}")
    missing = [hf_name(n) for n in shapes if n not in ours]
    if missing:
        raise PretrainedError(f"{path}: missing tensors {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    return ours


# ---- tokenizer

def has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()


def read_tokenizer(path: Path, vocab_size: int):
    """The directory's tokenizer (tokenizer.json, else tokenizer.model), or None when it has none;
    PretrainedError when its ids do not fit the model's embedding."""
    if not has_tokenizer(path):
        return None
    from xtrain.data.tokenizer import open_tokenizer

    tok = open_tokenizer(path)
    if tok.vocab_size > vocab_size:
        raise PretrainedError(f"{path}: the tokenizer has ids up to {tok.vocab_size - 1}, beyond the model's "
                           f"vocab_size {vocab_size}")
    return tok
