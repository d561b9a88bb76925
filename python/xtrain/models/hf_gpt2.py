"""GPT-2 between xtrain and Hugging Face's GPT2LMHeadModel: the config and the tensor names both
ways (import: from_pretrained and `xtrain train --init-from`; export: xtrain.io.export).

    model = GPT2.from_pretrained("openai-community/gpt2")     # or a local directory
    xtrain train --init-from DIR --data DIR ...                # hf_import.read_pretrained dispatches here

    Hugging Face                                  xtrain (models/gpt2.py)
    [transformer.]wte.weight (V, C)               wte.weight; wte.pad = zeros (padded_vocab_size - V rows)
    [transformer.]wpe.weight (P, C)               wpe.weight
    ...h.N.ln_{1,2}.{weight,bias}, ln_f.*         the same names
    ...h.N.attn.c_attn.weight (C, 3C) Conv1D      h.N.attn.{q,k,v}_proj.weight: the three column
    ...h.N.attn.c_attn.bias (3C)                  blocks, transposed (Linear is [out, in]); biases split
    ...h.N.attn.c_proj.weight (C, C) Conv1D       h.N.attn.c_proj.weight, transposed
    ...h.N.mlp.c_fc.weight (C, 4C), c_proj (4C, C) h.N.mlp.c_fc.weight, h.N.mlp.c_proj.weight, transposed
    lm_head.weight                                none: tied to wte (one present must equal wte)

Decisions:
- Config: n_embd -> dim, n_layer -> n_layers, n_head -> n_heads, n_positions -> max_seq,
  layer_norm_epsilon -> norm_eps, vocab_size as is (padded to a multiple of 128 inside xtrain,
  llm.c's 50304 for GPT-2). Refused with a PretrainedError naming it: an activation other than
  GELU's tanh form (gelu_new, gelu_pytorch_tanh), n_inner other than 4 x n_embd, untied
  embeddings, attention scaled by the layer index or not scaled, cross-attention, head dim > 256.
- Both name layouts are read: the original checkpoints' (no prefix: openai-community/gpt2) and
  save_pretrained's ("transformer."). The causal-mask buffers older files carry (attn.bias,
  attn.masked_bias) are skipped: they are a function of the config. Export writes the
  "transformer." names and no lm_head, as save_pretrained does for a tied model.
- Reading the files (safetensors headers, shards, dtypes, the tokenizer, hub ids) is
  hf_import's (read_pretrained dispatches a GPT-2 directory to _read_gpt2); only the mapping lives
  here, and it imports nothing of xtrain (the config class is passed in).
"""

from __future__ import annotations

import numpy as np

ARCHITECTURE = "GPT2LMHeadModel"
MODEL_TYPE = "gpt2"
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
MAX_HEAD_DIM = 256
SKIPPED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
PREFIX = "transformer."


def is_gpt2(hf: dict) -> bool:
    """Whether a config.json dict describes a GPT-2 model."""
    archs = hf.get("architectures") or []
    return archs == [ARCHITECTURE] or (not archs and hf.get("model_type") == MODEL_TYPE)


def config_from_hf(hf: dict, source, error, config_cls) -> "GPT2Config":
    """The config_cls (GPT2Config) of a GPT-2 config.json dict; error(message) raises hf_import's
    PretrainedError."""
    def unsupported(what: str):
        error(f"{source}: {what} is not supported by xtrain's GPT-2 model")

    act = hf.get("activation_function", "gelu_new")
    if act not in TANH_GELUS:
        unsupported(f"activation_function {act!r} (only GELU's tanh form: {', '.join(TANH_GELUS)})")
    if hf.get("tie_word_embeddings", True) is not True:
        unsupported("tie_word_embeddings = false (the head is wte)")
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights", True) is not True:
        unsupported("attention scaled other than by 1/sqrt(head_dim)")
    if hf.get("add_cross_attention"):
        unsupported("cross-attention")
    ints = {}
    for key in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
        v = hf.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            error(f"{source}: {key} must be a positive integer, got {v!r}")
        ints[key] = v
    n_inner = hf.get("n_inner")
    if n_inner is not None and n_inner != 4 * ints["n_embd"]:
        unsupported(f"n_inner {n_inner} (the MLP is 4 x n_embd = {4 * ints['n_embd']} wide)")
    if ints["n_embd"] % ints["n_head"] or ints["n_embd"] // ints["n_head"] > MAX_HEAD_DIM:
        unsupported(f"n_embd {ints['n_embd']} over n_head {ints['n_head']} (the head dim must divide it and be "
                    f"at most {MAX_HEAD_DIM})")
    eps = hf.get("layer_norm_epsilon", 1e-5)
    try:
        return config_cls(vocab_size=ints["vocab_size"], dim=ints["n_embd"], n_layers=ints["n_layer"],
                          n_heads=ints["n_head"], max_seq=ints["n_positions"], norm_eps=float(eps))
    except (TypeError, ValueError) as e:
        error(f"{source}: {e}")


def params_from_hf(raw: dict, config: GPT2Config, source, error) -> dict:
    """Our name -> float32 array from the Hugging Face tensors `raw` (name -> array), checked:
    every tensor present with its shape, nothing unexpected (error(message) raises)."""
    C = config.dim
    tensors = {}
    for name, a in raw.items():
        if name.endswith(SKIPPED_SUFFIXES):
            continue
        tensors[name[len(PREFIX):] if name.startswith(PREFIX) else name] = a
    head = tensors.pop("lm_head.weight", None)
    out = {}

    def take(name, shape):
        if name not in tensors:
            error(f"{source}: tensor {name} is missing")
        a = tensors.pop(name)
        if tuple(a.shape) != tuple(shape):
            error(f"{source}: tensor {name} has shape {tuple(a.shape)}, expected {tuple(shape)}")
        return np.asarray(a, dtype=np.float32)

    out["wte.weight"] = take("wte.weight", (config.vocab_size, C))
    if config.padded_vocab_size > config.vocab_size:
        out["wte.pad"] = np.zeros((config.padded_vocab_size - config.vocab_size, C), np.float32)
    out["wpe.weight"] = take("wpe.weight", (config.max_seq, C))
    F = config.ffn_dim
    for i in range(config.n_layers):
        p = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[p + ln + ".weight"] = take(p + ln + ".weight", (C,))
            out[p + ln + ".bias"] = take(p + ln + ".bias", (C,))
        w = take(p + "attn.c_attn.weight", (C, 3 * C))
        b = take(p + "attn.c_attn.bias", (3 * C,))
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            out[p + f"attn.{proj}.weight"] = np.ascontiguousarray(w[:, j * C:(j + 1) * C].T)
            out[p + f"attn.{proj}.bias"] = b[j * C:(j + 1) * C].copy()
        for name, shape in (("attn.c_proj", (C, C)), ("mlp.c_fc", (C, F)), ("mlp.c_proj", (F, C))):
            out[p + name + ".weight"] = np.ascontiguousarray(take(p + name + ".weight", shape).T)
            out[p + name + ".bias"] = take(p + name + ".bias", (shape[1],))
    out["ln_f.weight"] = take("ln_f.weight", (C,))
    out["ln_f.bias"] = take("ln_f.bias", (C,))
    if tensors:
        error(f"{source}: unexpected tensors {sorted(tensors)[:8]} for a GPT-2 model")
    if head is not None and not np.array_equal(np.asarray(head, np.float32), out["wte.weight"]):
        error(f"{source}: lm_head.weight differs from wte.weight, but GPT-2's head is tied to the embedding")
    return {name: out[name] for name in config.param_shapes()}


def hf_tensors(params: dict, config: GPT2Config) -> dict:
    """Hugging Face name -> float32 array of GPT2LMHeadModel from our parameters (name -> array):
    the inverse of params_from_hf (the padded rows wte.pad are llm.c's, not Hugging Face's)."""
    out = {PREFIX + "wte.weight": params["wte.weight"], PREFIX + "wpe.weight": params["wpe.weight"]}
    for i in range(config.n_layers):
        p = f"h.{i}."
        q = PREFIX + p
        for ln in ("ln_1", "ln_2"):
            out[q + ln + ".weight"], out[q + ln + ".bias"] = params[p + ln + ".weight"], params[p + ln + ".bias"]
        projs = ("q_proj", "k_proj", "v_proj")
        out[q + "attn.c_attn.weight"] = np.ascontiguousarray(
            np.concatenate([params[p + f"attn.{j}.weight"] for j in projs], axis=0).T)
        out[q + "attn.c_attn.bias"] = np.concatenate([params[p + f"attn.{j}.bias"] for j in projs])
        for name in ("attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            out[q + name + ".weight"] = np.ascontiguousarray(params[p + name + ".weight"].T)
            out[q + name + ".bias"] = params[p + name + ".bias"]
    out[PREFIX + "ln_f.weight"], out[PREFIX + "ln_f.bias"] = params["ln_f.weight"], params["ln_f.bias"]
    return out


def hf_config(config: GPT2Config, dtype_name: str, eot_id: int) -> dict:
    """The config.json of GPT2LMHeadModel for `config` (dtype_name: "float32" or "bfloat16")."""
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size, "n_embd": config.dim, "n_layer": config.n_layers,
        "n_head": config.n_heads, "n_positions": config.max_seq, "n_ctx": config.max_seq, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": config.norm_eps,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": 0.0,
        "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "use_cache": True,
        "torch_dtype": dtype_name, "bos_token_id": eot_id, "eos_token_id": eot_id,
    }

