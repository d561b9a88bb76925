"""Generation with a KV cache: prefill the prompts once, then one token per row per step.

    prompts (B rows, any lengths) -> right-pad to P -> forward_cached(model, ids (B, P))  prefill
        k, v of every layer (k after q/k norm and RoPE) -> KVCache (B, L, H_kv, D) per layer
        logits of each row's last prompt token -> pick -> token
    while a row is active: forward_cached(model, token (B, 1))                            decode
        each row at its own position: rope at that position, k/v written into its next slot,
        ops.decode_attention over its first `length` slots -> logits (B, V) -> pick -> token

The model's forward over the cache (KVCache, forward_cached) is xtrain.models.decode; this module
is the loop around it: prompts, picks, stop tokens, and the step as a CUDA graph.

Decisions:
- Per-row lengths, not left padding: a row's positions are 0..n-1 whatever the batch, so a batched
  prompt gives the same tokens as the prompt alone (to rounding), and the prefill runs the model's
  own causal flash attention over right-padded rows (padding sits after every real token, so no
  real position sees it). Slots a row's padding filled are overwritten by its decode steps before
  its length reaches them.
- The cache is allocated once per call: L = the longest row's final length (at most max_seq), so
  no step reallocates or copies it. A finished row stays in the batch (no compaction): it re-feeds
  its last token at its last position, which rewrites the same slot with the same values, and its
  output stops growing.
- RoPE positions never slide: a row stops at max_seq tokens (prompt included), and a prompt longer
  than max_seq is an error rather than a silently cropped window.
- Greedy decoding picks on the device: ops.greedy_next_ takes each row's argmax of the step's
  logits (the first of equal maxima, as numpy's argmax) and advances the row's state (token fed
  next, position, length, done) in device memory, and writes the token into a ring of R steps. The
  host launches R steps back to back, queues an asynchronous read of the ring, launches the next
  R, and only then waits for the first read: it never waits on the GPU in between (the one sync
  point per step was most of a batch-1 step's time), and the GPU is never left without work.
- Sampling runs on the host (numpy, float64) from the step's (B, V) logits, the one sync point
  per step. Order: temperature, top-k, top-p, then one draw per active row in row order from one
  numpy Generator (seeded with `seed`, or the caller's `generator`), so the same call repeats.
- On CUDA the decode step is a CUDA graph (DecodeGraph): the first decode step runs eagerly (the
  warm-up), the second captures the step once, and every step from then on is one replay (after,
  when sampling, one host-to-device copy of the step's inputs). Everything a step reads or writes
  that changes from token to token lives in buffers allocated before the capture (the KV cache,
  the inputs or the greedy state, the ring, the logits buffer), so a replay is the same kernels
  with the same values in the same order: the tokens and logits are bitwise those of the eager
  step. cuda_graphs=False, the CPU, or a failed capture (noted once) run it eagerly.
- The captured step outlives its call (KeptDecode): the model keeps its last graph with the KV cache
  and the buffers it reads, and the next call of the same shape (rows, slots, greedy ring, stop
  token, decode path, on the same thread, with the same weight buffers) prefills into that cache,
  rewrites the buffers and replays at once: no eager warm-up step, capture or instantiation per
  call. The weights are read at replay time, so training between calls is seen. One shape is kept
  per model, and only a cache of at most KEEP_DECODE_MAX_BYTES; release_decode(model) frees it.
"""

from __future__ import annotations

import math
import numbers
import sys
import threading
from collections import deque

import numpy as np

import xtrain
from xtrain import ops

from .decode import KVCache, forward_cached, signature

# top-p first looks at this many of the most likely tokens (argpartition, cheap) and sorts the whole
# vocabulary only for a row whose mass there is below top_p.
TOP_P_CANDIDATES = 1024


def decode_graph_blocker(model, cuda_graphs: bool) -> str | None:
    """Why generate's decode step on `model` runs eagerly, or None when it is captured."""
    if not cuda_graphs:
        return "switched off"
    if not str(model.device).startswith("cuda"):
        return "not a CUDA device"
    if not xtrain.cuda.is_available():
        return "CUDA is not available"
    return None


def _capture(graph, step):
    """Record step() into graph (nothing runs); returns step's output, which each replay fills."""
    with xtrain.cuda.graph(graph):
        return step()


_failure_noted = False  # a failed capture is reported once per process


def _note_failure(message: str) -> None:
    global _failure_noted
    if not _failure_noted:
        _failure_noted = True
        print(f"xtrain: generate: {message}; the decode steps run eagerly", file=sys.stderr)


class DecodeGraph:
    """One decode step, step() (every layer, the final norm and the head for one token per row,
    and on the greedy path the device-side pick), as a CUDA graph captured once per generate()
    call and replayed for every next token.

    step() must take every per-token value from buffers that exist before the capture and put its
    results into such buffers: the KV cache (allocated for the whole call), the inputs (sampling:
    tokens, positions, lengths, written by the host before each step) or the greedy state, the
    ring and the logits buffer. The bf16 weight copies are made by the eager warm-up step (the
    weights do not change during a call, so the capture casts nothing); so every address the
    graph reads is fixed.

    run() runs the first call eagerly (the warm-up: cuBLAS handle and workspace, the bf16 weight
    copies, the allocator's blocks), captures at the second (the capture runs nothing) and replays
    from then on. With capture=False, or after a failed capture (noted once per process; nothing of
    it ran), every call runs step() eagerly."""

    def __init__(self, model, step, capture: bool):
        device = str(model.device)
        self.index = int(device.split(":")[1]) if ":" in device else 0
        self.step, self.capture = step, capture
        self.graph = None
        self.runs = self.eager_steps = 0   # steps run (replays and eager), of them eager
        self.failed = None        # why the capture failed, or None

    def run(self) -> None:
        self.runs += 1
        if self.graph is not None:
            self.graph.replay()
            return
        if self.capture and self.failed is None and self.eager_steps > 0:
            try:
                graph = xtrain.cuda.Graph(self.index)
                _capture(graph, self.step)
                self.graph = graph
            except Exception as e:  # nothing of the capture ran: this step and the rest run eagerly
                self.failed = f"{type(e).__name__}: {e}"
                _note_failure(f"capture of the decode step as a CUDA graph failed ({self.failed})")
            else:
                self.graph.replay()
                return
        self.eager_steps += 1
        self.step()

    @property
    def num_nodes(self) -> int:
        """Kernels, copies and memsets of one replay (0 before the capture)."""
        return self.graph.num_nodes if self.graph is not None else 0


# generate() keeps its decode graph for the next call of the same shape (KeptDecode) when this is
# True and the KV cache takes at most KEEP_DECODE_MAX_BYTES.
KEEP_DECODE = True
KEEP_DECODE_MAX_BYTES = 256 << 20


class KeptDecode:
    """A generate() call's decode step kept for the next call of the same shape: the KV cache, the
    buffers the step reads and writes (greedy: the state and the ring; sampled: the inputs and the
    logits buffer), the views the cache and the step take of them, and the DecodeGraph whose
    capture baked in all of their addresses. key: what must match for a replay to be that step."""

    def __init__(self, key: tuple, cache: "KVCache"):
        self.key, self.cache = key, cache
        self.runner = None
        self.buffers = {}

    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.cache.layers)

    def build(self, model, step, capture: bool, **buffers) -> None:
        """The first call of this shape: the step's buffers (with the views of positions and
        lengths the cache now holds) and its DecodeGraph; kept on the model when it has a key."""
        self.buffers = dict(buffers, positions=self.cache.positions, lengths=self.cache.lengths)
        self.runner = DecodeGraph(model, step, capture)
        if self.key is not None:
            _keep(model, self)

    def resume(self) -> dict:
        """A later call: the cache attends through the kept positions and lengths again; returns
        the kept buffers."""
        self.cache.positions, self.cache.lengths = self.buffers["positions"], self.buffers["lengths"]
        return self.buffers


def _keep_key(model, path: tuple, B: int, T: int) -> tuple:
    """What a kept decode step depends on beyond its buffers: the path (greedy ring and stop token,
    or sampled), the cache's shape, the thread (its stream), the device, and the model's decode
    signature (decode.signature: its weight buffers' addresses, which the graph reads, and the
    decode switches the step was built under)."""
    return (path, B, T, threading.get_ident(), str(model.device), signature(model))


def _kept(model, key):
    kept = model.__dict__.get("_kept_decode")
    return kept if kept is not None and key is not None and kept.key == key else None


def _keep(model, kept: KeptDecode) -> None:
    """Keep `kept` on the model for the next call (replacing what it kept), or keep nothing when it
    is too large."""
    model.__dict__["_kept_decode"] = kept if kept.nbytes() <= KEEP_DECODE_MAX_BYTES else None


def release_decode(model) -> None:
    """Free the decode graph, KV cache and buffers generate() kept on `model` (KeptDecode)."""
    model.__dict__.pop("_kept_decode", None)


# The greedy path's ring: steps launched back to back between two reads of the tokens (the host
# reads a chunk of this many steps while the next is queued, so it learns of a stop token up to
# twice this many steps late; the extra steps change nothing it keeps).
GREEDY_RING = 32
# Tests set this False to run greedy decoding through pick() on the host (the reference).
DEVICE_GREEDY = True


def generate(model, prompts, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, greedy: bool = False, seed: int = 0, generator=None,
             stop_token: int | None = None, pad_token: int | None = None,
             cuda_graphs: bool = True) -> np.ndarray:
    """Continue each prompt by up to max_new_tokens tokens; returns int64 (B, T).

    prompts: int (B, S) (array, xtrain.Tensor, or one flat sequence for B = 1) or a list of B
    sequences of any (non-zero) lengths. Row b of the result is prompt b, its new tokens, then
    pad_token (default: stop_token, else 0) up to T, the longest row's length.
    A row stops after it produces stop_token (included in the row) or at
    min(len(prompt) + max_new_tokens, model.config.max_seq) tokens.
    greedy=True or temperature=0: the most likely token (the first on ties), picked on the device.
    Otherwise softmax of logits / temperature, restricted to the top_k most likely tokens and then
    to the smallest set of most likely tokens whose probability reaches top_p (at least one token),
    drawn from `generator` (a numpy Generator) or a PCG64 seeded with `seed`.
    cuda_graphs: on CUDA, capture the decode step once as a CUDA graph and replay it for every
    token (DecodeGraph; bitwise the eager step's tokens and logits), kept for the next call of the
    same shape (KeptDecode, release_decode); a no-op on the CPU.
    Runs under no_grad in eval mode (the model's mode is restored)."""
    rows = _prompt_rows(prompts)
    c = model.config
    _check_args(rows, c, max_new_tokens, temperature, top_k, top_p, stop_token, pad_token)
    if not isinstance(cuda_graphs, (bool, np.bool_)):
        raise TypeError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy.random.Generator or None, got {type(generator).__name__}")
    if generator is None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed < 2**128):
        raise ValueError(f"seed must be an integer in [0, 2**128), got {_short(seed)}")
    max_new_tokens = min(int(max_new_tokens), c.max_seq)  # no row grows past max_seq anyway
    greedy = greedy or temperature == 0
    rng = generator if generator is not None else np.random.Generator(np.random.PCG64(seed))
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    limit = np.minimum(lens + max_new_tokens, c.max_seq)           # each row's final length cap
    B, P, T = len(rows), int(lens.max()), int(limit.max())
    pad = pad_token if pad_token is not None else (stop_token if stop_token is not None else 0)
    out = np.full((B, T), pad, dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, :lens[b]] = r
    if not (lens < limit).any():
        return out

    was_training = model.training
    model.eval()
    try:
        with xtrain.no_grad():
            capture = decode_graph_blocker(model, cuda_graphs) is None
            device_greedy = greedy and DEVICE_GREEDY
            path = ("greedy", min(GREEDY_RING, int((limit - lens).max())), stop_token) if device_greedy else ("sampled",)
            key = _keep_key(model, path, B, T) if capture and KEEP_DECODE else None
            kept = _kept(model, key)
            if kept is None:
                kept = KeptDecode(key, KVCache(model, B, T))
            cache = kept.cache
            cache.empty = True
            cache.at(np.zeros(B, dtype=np.int64))
            ids = xtrain.tensor(out[:, :P], device=model.device)            # right-padded (B, P)
            last = xtrain.tensor(np.arange(B) * P + lens - 1, device=model.device)
            logits = forward_cached(model, ids, cache, last)
            cache.empty = False
            if device_greedy:
                cur = _decode_greedy(model, kept, logits, out, lens, limit, stop_token, capture)
            else:
                cur = _decode_sampled(model, kept, logits, out, lens, limit, temperature, top_k, top_p,
                                      greedy, rng, stop_token, capture)
    finally:
        model.train(was_training)
    return out[:, :int(cur.max())]


def _decode_greedy(model, kept, logits, out, lens, limit, stop_token, capture) -> np.ndarray:
    """Greedy decoding with the pick on the device (ops.greedy_next_); fills out, returns each row's
    final length. The state's rows: token fed next, position (its slot), length = position + 1,
    limit, done, count; positions and lengths are the cache's, token the step's input. kept: the
    cache, and the state, ring and step of an earlier call of this shape (then the state is
    rewritten in place and the step replays at once) or none yet (made here, then kept)."""
    B = len(lens)
    cache = kept.cache
    host_state = np.stack([np.zeros(B), lens - 1, lens, limit, lens >= limit, np.zeros(B)]).astype(np.int64)
    picks = int((limit - lens).max())        # picks the longest row needs, the prompt's included
    R = min(GREEDY_RING, picks)
    if kept.runner is None:
        state = xtrain.tensor(host_state, device=model.device)
        ring = xtrain.zeros((R, B), dtype="int64", device=model.device)
        ids = state._storage_view(0, (B, 1))
        cache.positions, cache.lengths = state._storage_view(B, (B,)), state._storage_view(2 * B, (B,))

        def step():
            logits = forward_cached(model, ids, cache)
            with xtrain.cuda.early_launch():      # the pick reads nothing before its wait
                ops.greedy_next_(logits, state, ring, stop_token)

        kept.build(model, step, capture, state=state, ring=ring)
    else:
        kept_buffers = kept.resume()
        state, ring = kept_buffers["state"], kept_buffers["ring"]
        state.copy_(xtrain.tensor(host_state, device="cpu"))                 # outside any capture
    runner = kept.runner
    ops.greedy_next_(logits, state, ring, stop_token)       # the token after each prompt
    cur, finished = lens.copy(), lens >= limit
    # Calls are launched in chunks of R (call c writes ring slot c % R), each followed by an
    # asynchronous read of the ring; a chunk's tokens are taken in only once the next chunk is
    # queued, so the GPU always has a chunk of steps ahead while the host waits and unpacks
    # (reading right after a chunk left it idle from the read until the next launch).
    pending = deque()                         # (first call, end call, the ring's read) per chunk
    start, calls = 0, 1                       # the next chunk's first call; greedy_next_ calls made
    while True:
        if start < picks:
            end = min(start + R, picks)
            while calls < end:
                runner.run()
                calls += 1
            pending.append((start, end, xtrain.cuda.read_array_async(ring)))
            start = end
            if len(pending) < 2 and start < picks:
                continue
        first, end, read = pending.popleft()
        toks = read.wait()                    # sync point: waits for this chunk only
        for c in range(first, end):
            row = toks[c % R]
            taken = row >= 0
            finished |= ~taken
            idx = np.flatnonzero(taken)
            out[idx, cur[idx]] = row[idx]
            cur[idx] += 1
            if stop_token is not None:
                finished[idx[row[idx] == stop_token]] = True
        finished |= cur >= limit
        if finished.all() or end == picks:
            return cur


def _decode_sampled(model, kept, logits, out, lens, limit, temperature, top_k, top_p, greedy, rng, stop_token,
                    capture) -> np.ndarray:
    """Decoding with the pick on the host (pick()); fills out, returns each row's final length.
    What changes from token to token goes to the device in one int64 buffer the step reads,
    `inputs` (3 * B,): the tokens fed (B, 1), the rows' write positions (B,) and the lengths
    attended to (B,) = positions + 1, by one host-to-device copy (pinned staging, no wait) before
    each step; the step's logits land in one (B, V) buffer. kept: as _decode_greedy's."""
    B = len(lens)
    cache = kept.cache
    if kept.runner is None:
        inputs = xtrain.zeros((3 * B,), dtype="int64", device=model.device)
        ids = inputs._storage_view(0, (B, 1))
        cache.positions, cache.lengths = inputs._storage_view(B, (B,)), inputs._storage_view(2 * B, (B,))
        buf = xtrain.empty(*logits.shape, dtype=logits.dtype, device=model.device)

        def step():
            buf.copy_(forward_cached(model, ids, cache))

        kept.build(model, step, capture, inputs=inputs, buf=buf)
    else:
        kept_buffers = kept.resume()
        inputs, buf = kept_buffers["inputs"], kept_buffers["buf"]
    runner = kept.runner
    cur = lens.copy()                                             # tokens in each row so far
    active = cur < limit
    while True:
        # Sync point: the step's logits come to the host to pick the next tokens.
        nxt = pick(np.asarray(logits.numpy(), dtype=np.float32)[active], temperature, top_k, top_p, greedy, rng)
        idx = np.flatnonzero(active)
        out[idx, cur[idx]] = nxt
        cur[idx] += 1
        active &= cur < limit
        if stop_token is not None:
            active[idx[nxt == stop_token]] = False
        if not active.any():
            return cur
        # Every row feeds its last token at its last position; a finished row repeats its final
        # step (the same values into the same slot) and its output is left alone.
        tokens = out[np.arange(B), cur - 1]
        inputs.copy_(xtrain.tensor(np.concatenate([tokens, cur - 1, cur]), device="cpu"))   # outside any capture
        runner.run()
        logits = buf


def pick(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None, greedy: bool,
         rng: np.random.Generator) -> np.ndarray:
    """The next token of each row of logits (R, V): greedy, or a draw after temperature, top-k and
    top-p (generate's rules); int64 (R,)."""
    if greedy:
        return np.argmax(logits, axis=1).astype(np.int64)
    z = logits.astype(np.float64) / temperature
    V = z.shape[1]
    if top_k is not None and top_k < V:
        keep = np.argpartition(z, V - top_k, axis=1)[:, V - top_k:]      # the top_k of each row
        masked = np.full_like(z, -np.inf)
        np.put_along_axis(masked, keep, np.take_along_axis(z, keep, axis=1), axis=1)
        z = masked
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        p = np.stack([_top_p(row, top_p) for row in p])
    # Inverse CDF with one uniform draw u in [0, 1) per row, in row order: the token i with
    # cdf[i-1] <= u * total < cdf[i], never one of probability 0.
    u = rng.random(p.shape[0])
    cdf = np.cumsum(p, axis=1)
    return np.minimum((cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1), V - 1).astype(np.int64)


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """p restricted to the smallest set of most likely tokens with mass >= top_p, renormalised."""
    m = min(p.size, TOP_P_CANDIDATES)
    cand = np.argpartition(p, p.size - m)[p.size - m:] if m < p.size else np.arange(p.size)
    if p[cand].sum() < top_p:
        cand = np.arange(p.size)
    order = cand[np.argsort(-p[cand], kind="stable")]
    csum = np.cumsum(p[order])
    n = min(int(np.searchsorted(csum, top_p)) + 1, order.size)   # first prefix reaching top_p
    kept = np.zeros_like(p)
    kept[order[:n]] = p[order[:n]]
    return kept / kept.sum()


def _prompt_rows(prompts) -> list[np.ndarray]:
    if isinstance(prompts, xtrain.Tensor):
        prompts = prompts.numpy()
    if isinstance(prompts, np.ndarray) or (isinstance(prompts, (list, tuple)) and prompts
                                          and all(isinstance(t, numbers.Integral) for t in prompts)):
        arr = np.asarray(prompts)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2:
            raise ValueError(f"prompts must be (batch, seq) or a list of sequences, got shape {arr.shape}")
        prompts = list(arr)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of token sequences or a (batch, seq) array, "
                         f"got {type(prompts).__name__} {prompts!r:.60}")
    rows = []
    for b, r in enumerate(prompts):
        a = np.asarray(r)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"prompt {b} must be a non-empty sequence of token ids, got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"prompt {b} must hold integer token ids, got dtype {a.dtype}")
        rows.append(a.astype(np.int64))
    return rows


def _short(v) -> str:
    """repr of an argument, a huge integer by its size."""
    if isinstance(v, numbers.Integral) and int(v).bit_length() > 64:
        return f"an integer of {int(v).bit_length()} bits"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (OverflowError, TypeError, ValueError):
        return False


def _check_args(rows, c, max_new_tokens, temperature, top_k, top_p, stop_token, pad_token) -> None:
    if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {_short(max_new_tokens)}")
    if not isinstance(temperature, numbers.Real) or not _finite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {_short(temperature)}")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {_short(top_k)}")
    if top_p is not None and (not isinstance(top_p, numbers.Real) or not _finite(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] or None, got {_short(top_p)}")
    for name, tok in (("stop_token", stop_token), ("pad_token", pad_token)):
        if tok is not None and (not isinstance(tok, numbers.Integral) or not 0 <= tok < c.vocab_size):
            raise ValueError(f"{name} must be a token id in [0, {c.vocab_size}) or None, got {tok!r}")
    for b, r in enumerate(rows):
        if len(r) > c.max_seq:
            raise ValueError(f"prompt {b} has {len(r)} tokens, more than the model's max_seq {c.max_seq}")
        bad = (r < 0) | (r >= c.vocab_size)
        if bad.any():
            raise ValueError(f"prompt {b} has token id {int(r[bad][0])} outside [0, {c.vocab_size})")
