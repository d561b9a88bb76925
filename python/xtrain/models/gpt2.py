"""GPT2: GPT-2 (as OpenAI released it, and as nanoGPT and llm.c train it), written on xtrain.nn.

    ids (B, S) -> wte(ids) + wpe(0..S-1) -> L x Block -> ln_f -> head (wte, tied) -> cross_entropy
    (with targets, the head + cross_entropy run fused: ops.linear_cross_entropy)

    Block.forward(x):  x = x + attn(ln_1(x))     attn: q/k/v (with biases), causal attention, c_proj
                       x = x + mlp(ln_2(x))      mlp:  c_proj(gelu_tanh(c_fc(x)))

This is the file to edit: each module's forward reads top to bottom over its named weights, and
is what training runs. The parameter names follow Hugging Face's GPT2LMHeadModel without its
"transformer." prefix (h.N.ln_1, h.N.attn.c_proj, h.N.mlp.c_fc, ln_f, ...), except that the
fused c_attn is three linears q_proj, k_proj, v_proj (its rows in that order: import and export
concatenate them, transposing Hugging Face's Conv1D layout; models/hf_gpt2.py, io/llmc.py).

Decisions:
- Shared with the Qwen3-style model (models/transformer.py): the residual stream (B*S, dim) from
  the embedding to the logits, q/k/v from one batched GEMM (ops.linear_multi: views of one
  buffer), ops.flash_attention in the (B, S, H, D) layout (causal, deterministic backward; head
  dim 64 runs its tensor-core kernels), each residual add fused into the LayerNorm after it
  (nn.ResidualStream -> ops.add_layer_norm, bitwise the add then the norm), the parameters in a
  ParamStore, bf16 as mixed precision, and the fused head + loss.
- Biases: every linear has one. The attention's output projection is ops.linear_bias and the MLP
  one ops.gelu_mlp: on CUDA the bias (and in bf16 GELU) run in the GEMMs' epilogues (cuBLASLt),
  so no biased output and no hidden gradient takes an elementwise pass of its own (docs/gpt2.md,
  "Fused epilogues"); on the CPU they are the unfused ops (linear, add, gelu), bitwise. q/k/v run
  as one batched GEMM with their biases (ops.linear_multi_bias), likewise fused on CUDA. Bias
  gradients are ordered row sums (deterministic). In bf16 the store keeps bf16 copies of the
  linears' weights and biases (nn.linear_params); LayerNorm weights and biases stay float32.
- Learned absolute positions: wpe (max_seq, dim), gathered at positions 0..S-1 (xtrain.arange on
  the device: nothing from the host, so the step captures as a CUDA graph) and added to the token
  embeddings in float32 before the cast to the compute dtype. max_seq sizes wpe: a weight.
- Tied head: the logits are ln_f(x) @ wte^T (in bf16 a cast of wte per forward; its backward adds
  the head's float32 gradient to the embedding's).
- The padded vocabulary of llm.c: the embedding table has padded_vocab_size rows (default: the
  vocabulary rounded up to a multiple of 128, 50304 for GPT-2's 50257), held as wte.weight (the
  vocab_size real rows) and wte.pad (the rest), one after the other in the store. The head
  reads wte.weight only, so the padded rows are never predicted and the loss is over the real
  vocabulary, as in llm.c; no gradient reaches them, and they are kept so that llm.c's model
  file round-trips.
- Init as GPT-2/nanoGPT/llm.c: N(0, 0.02) for every weight (both embeddings included), the
  residual projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2L), biases zero, LayerNorm
  weights one and biases zero; drawn on the CPU from one seeded xtrain.Generator in construction
  order, then uploaded into the store in one copy.
- Recompute (config.recompute, or block.recompute): forward_recompute below re-runs the attention
  half and the MLP (one op, ops.gelu_mlp) in backward: bitwise the same loss and gradients.
- Generation with a KV cache: models/gpt2_decode.py (the prefill is this forward; a decode step
  gathers wpe at each row's position and attends over the cache with ops.decode_attention).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import xtrain
from xtrain import nn, ops
from xtrain.store import ParamStore

from .transformer import TinyTransformer

IGNORE_INDEX = -100
INIT_STD = 0.02
ARCH = "gpt2"
# llm.c pads the vocabulary to a multiple of 128 (50257 -> 50304) for its kernels' sake.
VOCAB_PAD_MULTIPLE = 128


def padded_vocab(vocab_size: int) -> int:
    return -(-vocab_size // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE


@dataclass
class GPT2Config:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    max_seq: int = 1024
    padded_vocab_size: int | None = None  # None: vocab_size rounded up to a multiple of 128
    norm_eps: float = 1e-5
    bf16: bool = False
    recompute: bool = False
    dropout: float = 0.0
    doc_sep: int | None = None  # attention within documents (TransformerConfig.doc_sep); positions stay absolute

    def __post_init__(self):
        if self.padded_vocab_size is None and isinstance(self.vocab_size, int) and self.vocab_size > 0:
            self.padded_vocab_size = padded_vocab(self.vocab_size)
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq", "padded_vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"GPT2Config.{name} must be a positive integer, got {v!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"GPT2Config.n_heads ({self.n_heads}) must divide dim ({self.dim})")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"GPT2Config.padded_vocab_size ({self.padded_vocab_size}) must be at least "
                             f"vocab_size ({self.vocab_size})")
        if not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ValueError(f"GPT2Config.norm_eps must be positive, got {self.norm_eps!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPT2Config.dropout must be in [0, 1), got {self.dropout}")
        for name in ("bf16", "recompute"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPT2Config.{name} must be True or False, got {getattr(self, name)!r}")
        if self.doc_sep is not None and (not isinstance(self.doc_sep, int) or isinstance(self.doc_sep, bool)
                                         or not 0 <= self.doc_sep < self.vocab_size):
            raise ValueError(f"GPT2Config.doc_sep must be None or a token id in [0, {self.vocab_size}), "
                             f"got {self.doc_sep!r}")

    @property
    def arch(self) -> str:
        return ARCH

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return 4 * self.dim

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.bf16 else "float32"

    def to_dict(self) -> dict:
        """The record checkpoints keep: the fields and "arch": "gpt2" (xtrain.models.config_from_dict)."""
        return {"arch": ARCH, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "GPT2Config":
        d = dict(d)
        arch = d.pop("arch", ARCH)
        if arch != ARCH:
            raise ValueError(f"GPT2Config: the record is of architecture {arch!r}, not {ARCH!r}")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown GPT2Config fields {unknown}")
        return cls(**d)

    def block_param_shapes(self) -> dict:
        """name (relative to a block) -> shape of every parameter of one Block, in order."""
        d, f = self.dim, self.ffn_dim
        shapes = {"ln_1.weight": (d,), "ln_1.bias": (d,)}
        for proj in ("q_proj", "k_proj", "v_proj"):
            shapes.update({f"attn.{proj}.weight": (d, d), f"attn.{proj}.bias": (d,)})
        shapes.update({"attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
                       "ln_2.weight": (d,), "ln_2.bias": (d,),
                       "mlp.c_fc.weight": (f, d), "mlp.c_fc.bias": (f,),
                       "mlp.c_proj.weight": (d, f), "mlp.c_proj.bias": (d,)})
        return shapes

    def param_shapes(self) -> dict:
        """name -> shape of every parameter of GPT2(self), in named_parameters() order, without
        building the model. param_count() first when the config is untrusted."""
        shapes = {"wte.weight": (self.vocab_size, self.dim)}
        if self.padded_vocab_size > self.vocab_size:
            shapes["wte.pad"] = (self.padded_vocab_size - self.vocab_size, self.dim)
        shapes["wpe.weight"] = (self.max_seq, self.dim)
        block = self.block_param_shapes()
        for i in range(self.n_layers):
            shapes.update({f"h.{i}.{n}": s for n, s in block.items()})
        shapes.update({"ln_f.weight": (self.dim,), "ln_f.bias": (self.dim,)})
        return shapes

    def param_count(self) -> int:
        """len(param_shapes()), without building it."""
        return (4 + (self.padded_vocab_size > self.vocab_size)
                + len(self.block_param_shapes()) * self.n_layers)

    def core_params(self) -> int:
        """Parameters of the blocks (no embeddings or final norm)."""
        return self.n_layers * sum(math.prod(s) for s in self.block_param_shapes().values())

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token: 6 per weight of every GEMM (forward + backward; the head over
        the real vocabulary) plus the attention matmuls (causal counted in full, as nanoGPT/PaLM)."""
        n_matmul = self.n_layers * (4 * self.dim * self.dim + 2 * self.dim * self.ffn_dim) + self.dim * self.vocab_size
        return 6.0 * n_matmul + 12.0 * self.n_layers * self.dim * seq


# GPT-2's four sizes (n_heads of 64 dims each; the vocabulary comes from the tokenizer, 50257 for
# GPT-2's own, padded to 50304). max_seq is GPT-2's 1024 positions (wpe rows: a weight).
PRESETS = {
    "gpt2-124m": dict(dim=768, n_layers=12, n_heads=12, max_seq=1024),
    "gpt2-350m": dict(dim=1024, n_layers=24, n_heads=16, max_seq=1024),
    "gpt2-774m": dict(dim=1280, n_layers=36, n_heads=20, max_seq=1024),
    "gpt2-1.5b": dict(dim=1600, n_layers=48, n_heads=25, max_seq=1024),
}


def config_for(preset: str, vocab_size: int, **overrides) -> GPT2Config:
    if preset not in PRESETS:
        raise ValueError(f"unknown GPT-2 preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return GPT2Config(vocab_size=vocab_size, **{**PRESETS[preset], **overrides})


# ---- the modules

class Linear(nn.Linear):
    """nn.Linear with a bias, its forward ops.linear_bias: on CUDA the bias is added in the GEMM's
    epilogue (one pass over the output instead of two), on the CPU it is linear then add."""

    def __init__(self, in_features: int, out_features: int, generator=None, std: float = INIT_STD):
        super().__init__(in_features, out_features, bias=True, generator=generator, std=std)

    def forward(self, x):
        return ops.linear_bias(x, self.weight, self.bias)


class Attention(nn.Module):
    """Causal multi-head self-attention with biased q/k/v and output projections."""

    def __init__(self, c: GPT2Config, gen, residual_std: float):
        super().__init__()
        self.n_heads, self.head_dim = c.n_heads, c.head_dim
        self.q_proj = nn.Linear(c.dim, c.dim, bias=True, generator=gen, std=INIT_STD)
        self.k_proj = nn.Linear(c.dim, c.dim, bias=True, generator=gen, std=INIT_STD)
        self.v_proj = nn.Linear(c.dim, c.dim, bias=True, generator=gen, std=INIT_STD)
        self.c_proj = Linear(c.dim, c.dim, generator=gen, std=residual_std)
        self.dropout = nn.Dropout(c.dropout)

    def qkv(self, x):
        """x (rows, dim), already normed -> q, k, v (rows, dim) each, biases added; the three GEMMs
        as one batched GEMM, on CUDA with the biases in its epilogue (ops.linear_multi_bias)."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = ops.linear_multi_bias(x, [p.weight for p in projs], [p.bias for p in projs])
        return q, k, v

    def forward(self, x, seq: int, cache=None, doc_start=None):
        """x (B*S, dim), already normed -> (B*S, dim). With a KV cache (generation's prefill), k
        and v are also stored in it. doc_start: attention within documents (ops.document_starts)."""
        B, H, D = x.shape[0] // seq, self.n_heads, self.head_dim
        q, k, v = self.qkv(x)
        q, k, v = (t.reshape(B, seq, H, D) for t in (q, k, v))          # (B, S, H, D), no copy
        if cache is not None:
            cache.write(k, v)
        a = ops.flash_attention(q, k, v, causal=True, scale=1.0 / math.sqrt(D), doc_start=doc_start)
        return self.dropout(self.c_proj(a.reshape(B * seq, H * D)))     # (B*S, dim)


class MLP(nn.Module):
    """c_proj(gelu_tanh(c_fc(x))), 4 x dim wide, as one op (ops.gelu_mlp: on CUDA the biases in
    the GEMMs' epilogues, and in bf16 GELU and its derivative too; on the CPU the unfused linear,
    add, gelu, linear, add)."""

    def __init__(self, c: GPT2Config, gen, residual_std: float):
        super().__init__()
        self.c_fc = Linear(c.dim, c.ffn_dim, generator=gen, std=INIT_STD)
        self.c_proj = Linear(c.ffn_dim, c.dim, generator=gen, std=residual_std)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        """x (B*S, dim), already normed -> (B*S, dim)."""
        fc, proj = self.c_fc, self.c_proj
        return self.dropout(ops.gelu_mlp(x, fc.weight, fc.bias, proj.weight, proj.bias))


class Block(nn.Module):
    """One layer: attention, then the MLP, each on the LayerNormed stream and added to it."""

    def __init__(self, c: GPT2Config, gen):
        super().__init__()
        residual_std = INIT_STD / math.sqrt(2 * c.n_layers)
        self.ln_1 = nn.LayerNorm(c.dim, c.norm_eps)
        self.attn = Attention(c, gen, residual_std)
        self.ln_2 = nn.LayerNorm(c.dim, c.norm_eps)
        self.mlp = MLP(c, gen, residual_std)
        self.recompute = c.recompute  # GPT2.forward runs the block through forward_recompute

    def forward(self, x, seq: int, cache=None, doc_start=None):
        """The residual stream x (B*S, dim) -> (B*S, dim); x is an nn.ResidualStream in the
        model's forward (each add then runs fused into the norm after it) or a plain tensor."""
        x = x + self.attn(self.ln_1(x), seq, cache, doc_start)
        x = x + self.mlp(self.ln_2(x))
        return x


def forward_recompute(block: Block, x: nn.ResidualStream, seq: int, doc_start=None) -> nn.ResidualStream:
    """block(x, seq) with recompute: the attention half and the MLP half (ln_2 and the one-op MLP)
    run under nn.checkpoint (re-run in backward); what the block keeps is its input and the
    stream between the halves. The same modules run the same ops in the same order as
    Block.forward (add + layer_norm is bitwise the fused add_layer_norm), so the results are
    bitwise those without recompute."""
    if not isinstance(x, nn.ResidualStream):
        raise TypeError(f"forward_recompute: x must be an nn.ResidualStream, got {type(x).__name__}")
    ln_1, attn, ln_2, mlp = block.ln_1, block.attn, block.ln_2, block.mlp
    x = x.resolve()                                   # the add the block before left pending
    x = nn.checkpoint(lambda x: x + attn(ln_1(x), seq, None, doc_start), x, ln_1, attn)
    return nn.ResidualStream(x + nn.checkpoint(lambda x: mlp(ln_2(x)), x, ln_2, mlp))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config, device: str = "cpu", seed: int = 0):
        super().__init__()
        c = self.config = config
        gen = xtrain.Generator(seed)
        # Built on the CPU, then moved into the store on `device` with one upload.
        self.wte = nn.Embedding(c.vocab_size, c.dim, generator=gen, std=INIT_STD)
        if c.padded_vocab_size > c.vocab_size:  # llm.c's padded rows: never read by the forward
            self.wte.pad = nn.normal_param((c.padded_vocab_size - c.vocab_size, c.dim), INIT_STD, generator=gen)
        self.wpe = nn.Embedding(c.max_seq, c.dim, generator=gen, std=INIT_STD)
        self.dropout = nn.Dropout(c.dropout)
        self.h = nn.ModuleList(Block(c, gen) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.dim, c.norm_eps)
        self.store = ParamStore(self, device=device, compute_dtype=c.dtype, compute=nn.linear_params)
        self.tokenizer = None  # from_pretrained: the tokenizer that came with the weights

    @property
    def layers(self) -> nn.ModuleList:
        """The blocks (h), by the name the trainer and the generator use for every architecture."""
        return self.h

    @classmethod
    def from_pretrained(cls, path, device: str = "cpu", bf16: bool = False, **overrides) -> "GPT2":
        """A Hugging Face GPT-2 directory (config.json + model.safetensors) as a GPT2 on `device`;
        `bf16` and `overrides` (recompute, dropout) set the run options. The tokenizer beside the
        weights, if any, is `model.tokenizer`. See xtrain.models.hf_gpt2."""
        from xtrain.models import hf_import

        return hf_import.read_pretrained(path, {ARCH: GPT2Config}).build(cls, device, bf16=bool(bf16), **overrides)

    def head_weight(self):
        """The head's weight as the forward uses it: wte (the real vocabulary's rows), cast to the
        compute dtype (one cast per forward; its backward adds the float32 gradient to wte's)."""
        w = self.wte.weight
        return w if self.config.dtype == "float32" else ops.cast(w, self.config.dtype)

    def embed(self, ids, positions):
        """Token plus position embeddings: ids int (B, S), positions int (S,) or, with S = 1, (B,)
        -> (B*S, dim) in the compute dtype (the sum in float32, then one cast)."""
        B, S = ids.shape
        tok = self.wte(ids.reshape(B * S))                               # (B*S, dim) float32
        pos = self.wpe(positions)                                        # (S, dim) or (B, dim)
        x = tok + pos if positions.shape[0] == B * S else (tok.reshape(B, S, -1) + pos).reshape(B * S, -1)
        return self.dropout(x.to(self.config.dtype))

    def forward(self, ids, targets=None, return_logits=None):
        """ids int (B, S) -> (logits, loss), as TinyTransformer.forward: without targets the
        differentiable (B*S, V) logits and None; with targets (IGNORE_INDEX skipped) the fused head
        + loss: (None, float32 loss), or a detached copy of the logits when return_logits."""
        c = self.config
        ids = self._as_ids(ids, "ids")
        B, S = ids.shape
        if S > c.max_seq:
            raise ValueError(f"sequence length {S} exceeds max_seq {c.max_seq} (GPT-2's learned positions)")
        if targets is not None:
            targets = self._as_ids(targets, "targets")
            if tuple(targets.shape) != (B, S):
                raise ValueError(f"targets shape {tuple(targets.shape)} != ids shape {(B, S)}")
        # bf16: the linears' weights and biases in bf16 for this forward (one cast launch when they changed)
        with self.store.bound(self.store.compute_weights()):
            positions = xtrain.arange(0, S, dtype="int64", device=self.device)
            x = nn.ResidualStream(self.embed(ids, positions))  # each add fused into the next norm
            docs = ops.document_starts(ids, c.doc_sep) if c.doc_sep is not None else None
            for block in self.h:
                x = forward_recompute(block, x, S, docs) if block.recompute else block(x, S, doc_start=docs)
            x = self.ln_f(x)
            head = self.head_weight()                                    # (V, dim)
            if targets is None:
                return ops.linear(x, head), None                         # (B*S, V)
            loss, logits = ops.linear_cross_entropy(x, head, targets.reshape(B * S), ignore_index=IGNORE_INDEX,
                                                    return_logits=bool(return_logits))
        return logits, loss

    # The same as the Qwen3-style model's: the id checks, the device, generation over the KV cache
    # (xtrain.models.generate, which runs models/gpt2_decode.py for a GPT2; a row stops at max_seq
    # tokens, where GPT-2's positions end).
    _as_ids = TinyTransformer._as_ids
    device = TinyTransformer.device
    generate = TinyTransformer.generate
