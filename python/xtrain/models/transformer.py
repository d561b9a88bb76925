"""TinyTransformer: a decoder-only LM in the Hugging Face Qwen3 layout, written on xtrain.ops.

    ids (B, S) -> embed_tokens -> L x Block -> norm -> lm_head -> logits (B*S, V) -> cross_entropy
    (with targets, lm_head + cross_entropy run fused: ops.linear_cross_entropy)

    Block(x):  h = x + o_proj(sdpa(rope(q_norm(q_proj(n1(x)))), rope(k_norm(k_proj(n1(x)))), v_proj(n1(x))))
               y = h + down_proj(silu(gate_proj(n2(h))) * up_proj(n2(h)))

Decisions:
- The residual stream is (B*S, dim) from the embedding to the logits, so every linear is one GEMM
  over all tokens. Only attention needs the (B, S, H, D) view (per-head q/k RMSNorm over head_dim,
  RoPE) and the (B, H, S, D) layout (sdpa).
- The block is the free function `block_forward(config, x, params, seq, training)` over the block's
  tensors in the fixed order of `Block.PARAM_ORDER`, written as three parts: attention_forward
  (x + attention), mlp_hidden (up to the down projection's input g) and mlp_output (x + down(g)).
  With config.recompute, block_forward_recompute runs the first two parts under
  `xtrain.checkpoint` and the third outside (selective recompute: backward re-runs everything but
  the down projection's GEMM and the residual add, whose outputs backward never reads; it keeps g,
  an ffn-wide activation, per block). The same Python code builds the same graph either way,
  which is what makes recompute bitwise exact (DESIGN.md invariant 2).
- bf16 is mixed precision: parameters stay float32 leaves; the linear weights are cast to bf16 once
  per forward, all in one `ops.cast_many` (one launch on CUDA; each output has its own cast
  backward node returning the float32 gradient), activations are bf16 from the embedding on, norm
  weights stay float32 (rms_norm takes float32 weights with bf16 x), and the bf16 logits go into
  cross_entropy, which computes in float32. With recompute the bf16 copies stay alive through
  backward (2 bytes per weight) instead of being re-cast in every re-run.
- With targets, the head is ops.linear_cross_entropy(norm(x), lm_head weight, targets): the same
  loss and gradients as linear + cross_entropy (bitwise in float32 on the CPU), but the logits sit
  in a buffer with a 16-byte-aligned row stride (fast cuBLAS GEMMs for an odd vocabulary such as
  50257) and backward writes dlogits over them in place. forward(ids, targets) therefore returns
  (None, loss); return_logits=True adds a detached (B*S, V) copy of the logits. Without targets
  the logits come from ops.linear and stay differentiable.
- Parameter names mirror Qwen3 (layers.N.self_attn.q_proj.weight, ...); export prefixes "model.".
- Init as GPT-2/nanoGPT: N(0, 0.02) everywhere, residual projections (o_proj, down_proj) scaled by
  1/sqrt(2L), norms ones; drawn on the CPU from one seeded xtrain.Generator in construction order.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

import xtrain
from xtrain import nn, ops

IGNORE_INDEX = -100
INIT_STD = 0.02


@dataclass
class TransformerConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    head_dim: int
    ffn_dim: int
    max_seq: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    bf16: bool = False
    recompute: bool = False
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "head_dim", "ffn_dim", "max_seq"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {v!r}")
        if self.head_dim % 2:
            raise ValueError(f"TransformerConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError("TransformerConfig.rope_theta and norm_eps must be positive")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TransformerConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig fields {unknown}")
        return cls(**d)

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.bf16 else "float32"

    def core_params(self) -> int:
        """Parameters of the transformer blocks (no embedding, lm_head or final norm)."""
        qkvo = 4 * self.dim * self.n_heads * self.head_dim
        mlp = 3 * self.dim * self.ffn_dim
        norms = 2 * self.dim + 2 * self.head_dim
        return self.n_layers * (qkvo + mlp + norms)

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token: 6 per weight of every GEMM (forward + backward) plus the
        attention matmuls (causal counted in full, as nanoGPT/PaLM do)."""
        n_matmul = self.n_layers * (4 * self.dim * self.n_heads * self.head_dim
                                    + 3 * self.dim * self.ffn_dim) + self.dim * self.vocab_size
        return 6.0 * n_matmul + 12.0 * self.n_layers * self.n_heads * self.head_dim * seq


# Architecture presets; vocab_size comes from the tokenizer (config_for fills it in).
PRESETS = {
    "tiny": dict(dim=128, n_layers=4, n_heads=4, head_dim=32, ffn_dim=384, max_seq=256),
    "dim384": dict(dim=384, n_layers=12, n_heads=12, head_dim=32, ffn_dim=1024, max_seq=1024),
    "dim768": dict(dim=768, n_layers=18, n_heads=24, head_dim=32, ffn_dim=2048, max_seq=1024),
    # ffn 2736, not 8/3 * 1024 = 2730: a multiple of 8, so the MLP GEMMs' bf16 rows are 16-byte
    # aligned and cuBLAS uses its Hopper kernels (at 2730 they ran in align2 kernels, 2.6x slower).
    "dim1024": dict(dim=1024, n_layers=18, n_heads=32, head_dim=32, ffn_dim=2736, max_seq=1024),
}


def config_for(preset: str, vocab_size: int, **overrides) -> TransformerConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return TransformerConfig(vocab_size=vocab_size, **{**PRESETS[preset], **overrides})


# ---- the block, as functions of its tensors

def attention_forward(config: TransformerConfig, x, params, seq: int, training: bool = False):
    """The attention half of a block: x + o_proj(attention(input_layernorm(x))), (B*S, dim).

    params: Block.PARAM_ORDER[:7] (attn_norm, wq, wk, wv, wo, q_norm, k_norm), the linear
    weights already in the compute dtype (TinyTransformer.forward casts them once per step)."""
    (attn_norm, wq, wk, wv, wo, q_norm, k_norm) = params
    S, H, D = seq, config.n_heads, config.head_dim
    eps = config.norm_eps
    h = ops.rms_norm(x, attn_norm, eps)                              # (B*S, dim)
    # to_heads: (B*S, H*D) -> reshape (B, S, H, D) -> [rms_norm over D -> RoPE] -> (B, H, S, D)
    q = ops.to_heads(ops.linear(h, wq), S, H, q_norm, eps, config.rope_theta)
    k = ops.to_heads(ops.linear(h, wk), S, H, k_norm, eps, config.rope_theta)
    v = ops.to_heads(ops.linear(h, wv), S, H)
    a = ops.sdpa(q, k, v, causal=True, scale=1.0 / math.sqrt(D))     # (B, H, S, D)
    a = ops.from_heads(a)                                            # (B*S, H*D)
    a = _dropout(config, ops.linear(a, wo), training)                # (B*S, dim)
    return ops.add(x, a)


def mlp_hidden(config: TransformerConfig, x, params):
    """The MLP up to the down projection: silu(gate_proj(n2(x))) * up_proj(n2(x)), (B*S, ffn).
    params: Block.PARAM_ORDER[7:10] (mlp_norm, w_gate, w_up)."""
    (mlp_norm, w_gate, w_up) = params
    h = ops.rms_norm(x, mlp_norm, config.norm_eps)
    return ops.swiglu(ops.linear(h, w_gate), ops.linear(h, w_up))


def mlp_output(config: TransformerConfig, x, g, w_down, training: bool = False):
    """The block's end: x + down_proj(g)."""
    return ops.add(x, _dropout(config, ops.linear(g, w_down), training))


def block_forward(config: TransformerConfig, x, params, seq: int, training: bool = False):
    """One transformer block on the residual stream x (B*S, dim) -> (B*S, dim).

    params: the block's tensors in Block.PARAM_ORDER, linear weights in the compute dtype. `seq`
    is S (x holds B*S rows). Depends on nothing but its arguments and the default RNG (dropout),
    so each of its parts can be re-run by xtrain.checkpoint."""
    params = list(params)
    x = attention_forward(config, x, params[:7], seq, training)
    g = mlp_hidden(config, x, params[7:10])
    return mlp_output(config, x, g, params[10], training)


def block_forward_recompute(config: TransformerConfig, x, params, seq: int, training: bool = False):
    """block_forward with activation recompute (selective): the attention half and the MLP up to
    the down projection each run under xtrain.checkpoint, and the down projection runs outside,
    keeping its input g. Backward then re-runs everything but the down projection's GEMM and the
    residual add, whose results backward never reads. The same ops on the same tensors in the
    same order as block_forward, so the results are bitwise equal."""
    params = list(params)
    x = xtrain.checkpoint(functools.partial(attention_forward, config, seq=seq, training=training),
                          x, params[:7])
    g = xtrain.checkpoint(functools.partial(mlp_hidden, config), x, params[7:10])
    return mlp_output(config, x, g, params[10], training)


def _dropout(config: TransformerConfig, x, training: bool):
    if config.dropout == 0.0 or not training:
        return x
    # The default generator: checkpoint saves/restores it, so a recompute draws the same mask.
    return ops.dropout(x, config.dropout, True, None)


# ---- modules (containers of named parameters; the math is in block_forward)

class Attention(nn.Module):
    def __init__(self, c: TransformerConfig, device: str, gen, residual_std: float):
        super().__init__()
        inner = c.n_heads * c.head_dim
        self.q_proj = nn.Linear(c.dim, inner, device=device, generator=gen, std=INIT_STD)
        self.k_proj = nn.Linear(c.dim, inner, device=device, generator=gen, std=INIT_STD)
        self.v_proj = nn.Linear(c.dim, inner, device=device, generator=gen, std=INIT_STD)
        self.o_proj = nn.Linear(inner, c.dim, device=device, generator=gen, std=residual_std)
        self.q_norm = nn.RMSNorm(c.head_dim, c.norm_eps, device)
        self.k_norm = nn.RMSNorm(c.head_dim, c.norm_eps, device)


class MLP(nn.Module):
    def __init__(self, c: TransformerConfig, device: str, gen, residual_std: float):
        super().__init__()
        self.gate_proj = nn.Linear(c.dim, c.ffn_dim, device=device, generator=gen, std=INIT_STD)
        self.up_proj = nn.Linear(c.dim, c.ffn_dim, device=device, generator=gen, std=INIT_STD)
        self.down_proj = nn.Linear(c.ffn_dim, c.dim, device=device, generator=gen, std=residual_std)


class Block(nn.Module):
    # The order block_forward unpacks (names relative to the block).
    PARAM_ORDER = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                   "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                   "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                   "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")

    def __init__(self, c: TransformerConfig, device: str, gen):
        super().__init__()
        residual_std = INIT_STD / math.sqrt(2 * c.n_layers)
        self.input_layernorm = nn.RMSNorm(c.dim, c.norm_eps, device)
        self.self_attn = Attention(c, device, gen, residual_std)
        self.post_attention_layernorm = nn.RMSNorm(c.dim, c.norm_eps, device)
        self.mlp = MLP(c, device, gen, residual_std)

    # Indices of the linear weights in PARAM_ORDER (cast to bf16 once per step in bf16 runs).
    LINEAR = tuple(i for i, n in enumerate(PARAM_ORDER) if n.endswith("_proj.weight"))
    _PATHS = tuple(tuple(n.split(".")) for n in PARAM_ORDER)

    def block_params(self) -> list:
        """The block's parameters in PARAM_ORDER (looked up each call, so a replaced parameter,
        e.g. after load_state_dict, is the one used)."""
        out = []
        for path in self._PATHS:
            m = self
            for name in path[:-1]:
                m = m._modules[name]
            out.append(m._parameters[path[-1]])
        return out


class TinyTransformer(nn.Module):
    def __init__(self, config: TransformerConfig, device: str = "cpu", seed: int = 0):
        super().__init__()
        self.config = config
        gen = xtrain.Generator(seed)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim, device, gen, INIT_STD)
        self.layers = nn.ModuleList(Block(config, device, gen) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim, config.norm_eps, device)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, device=device, generator=gen,
                                 std=INIT_STD)
        self._cast_cache = None  # set_cast_cache

    def cast_parameters(self) -> list:
        """The float32 weights the forward casts to the compute dtype, in the order of its one
        ops.cast_many (every linear weight, then lm_head); [] without bf16."""
        if not self.config.bf16:
            return []
        linear = Block.LINEAR
        return [p[i] for p in (layer.block_params() for layer in self.layers) for i in linear] + \
            [self.lm_head.weight]

    def set_cast_cache(self, provider) -> None:
        """provider: a callable returning the bf16 casts of cast_parameters() (in order), already
        computed, or None when it has none; None removes it. The forward then takes those values
        instead of casting (the backward is the cast's). Data-parallel training uses it: each rank
        casts its share of the updated weights and the ranks gather the bf16 copies
        (xtrain.distributed.DataParallelAdamW)."""
        if provider is not None and not callable(provider):
            raise TypeError(f"set_cast_cache: provider must be callable or None, got {type(provider).__name__}")
        self._cast_cache = provider

    def forward(self, ids, targets=None, return_logits=None):
        """ids int (B, S) -> (logits, loss).

        Without targets: (logits (B*S, V) in the compute dtype, differentiable; None).
        With targets (int (B, S), IGNORE_INDEX skipped): the head and the loss run fused
        (ops.linear_cross_entropy) and the result is (None, float32 loss), or (a detached
        (B*S, V) copy of the logits, loss) when return_logits is True."""
        c = self.config
        ids = self._as_ids(ids, "ids")
        B, S = ids.shape
        if S > c.max_seq:
            raise ValueError(f"sequence length {S} exceeds max_seq {c.max_seq}")
        x = ops.embedding(self.embed_tokens.weight, ops.reshape(ids, (B * S,)))  # (B*S, dim) f32
        if c.bf16:
            x = ops.cast(x, "bfloat16")
        x = _dropout(c, x, self.training)
        blocks, head = self._compute_params()
        run = block_forward_recompute if c.recompute else block_forward
        for params in blocks:
            x = run(c, x, params, S, self.training)
        x = ops.rms_norm(x, self.norm.weight, c.norm_eps)
        if targets is None:
            return ops.linear(x, head), None                                # (B*S, V)
        targets = self._as_ids(targets, "targets")
        if tuple(targets.shape) != (B, S):
            raise ValueError(f"targets shape {tuple(targets.shape)} != ids shape {(B, S)}")
        loss, logits = ops.linear_cross_entropy(x, head, ops.reshape(targets, (B * S,)),
                                                ignore_index=IGNORE_INDEX,
                                                return_logits=bool(return_logits))
        return logits, loss

    def _compute_params(self):
        """(per block: its tensors in PARAM_ORDER, lm_head weight) with every linear weight in the
        compute dtype. bf16: one ops.cast_many over all of them (one launch on CUDA; each cast
        keeps its own backward node, so a weight's float32 gradient is final as soon as its
        own bf16 gradient is)."""
        blocks = [layer.block_params() for layer in self.layers]
        head = self.lm_head.weight
        if not self.config.bf16:
            return blocks, head
        linear = Block.LINEAR
        cached = self._cast_cache() if self._cast_cache is not None else None
        cast = ops.cast_many([p[i] for p in blocks for i in linear] + [head], "bfloat16", cached=cached)
        k = 0
        for p in blocks:
            for i in linear:
                p[i] = cast[k]
                k += 1
        return blocks, cast[k]

    def _as_ids(self, ids, what: str):
        if not isinstance(ids, xtrain.Tensor):
            ids = xtrain.tensor(np.asarray(ids, dtype=np.int64), device=self.device)
        if len(ids.shape) != 2:
            raise ValueError(f"{what} must be (batch, seq), got shape {tuple(ids.shape)}")
        if ids.dtype not in ("int32", "int64"):
            raise TypeError(f"{what} must be int32 or int64, got {ids.dtype}")
        return ids

    def generate(self, ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 greedy: bool = False, seed: int = 0, stop_token: int | None = None) -> np.ndarray:
        """Continue `ids` (B, S) by up to max_new_tokens; returns int64 (B, S + n).

        No KV cache: each step re-runs the last max_seq tokens (cost O(n * S^2), fine for samples).
        Sampling draws on the host from a numpy PCG64 seeded with `seed`, so samples repeat.
        Stops early when every row has produced `stop_token`."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0 (or use greedy), got {temperature}")
        if top_k is not None and top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")
        out = np.array(ids, dtype=np.int64)
        if out.ndim == 1:
            out = out[None, :]
        if out.ndim != 2 or out.shape[1] == 0:
            raise ValueError(f"generate needs a non-empty (batch, seq) prompt, got {out.shape}")
        rng = np.random.Generator(np.random.PCG64(seed))
        was_training = self.training
        self.eval()
        done = np.zeros(out.shape[0], dtype=bool)
        try:
            with xtrain.no_grad():
                for _ in range(max_new_tokens):
                    window = out[:, -self.config.max_seq:]
                    logits, _ = self(window)
                    # Sync point: the logits come to the host to pick the next token.
                    last = np.asarray(logits.numpy(), dtype=np.float32)
                    last = last.reshape(window.shape[0], window.shape[1], -1)[:, -1, :]
                    nxt = np.array([_pick(row, temperature, top_k, greedy, rng) for row in last])
                    out = np.concatenate([out, nxt[:, None]], axis=1)
                    if stop_token is not None:
                        done |= nxt == stop_token
                        if done.all():
                            break
        finally:
            self.train(was_training)
        return out


def _pick(logits: np.ndarray, temperature: float, top_k: int | None, greedy: bool,
          rng: np.random.Generator) -> int:
    if greedy:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(z.size, p=p))
