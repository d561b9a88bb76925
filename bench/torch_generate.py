"""PyTorch generators of an xtrain model, for bench/generate.py's peer rows (known issue 29).

The same weights go into transformers' Qwen3ForCausalLM (LlamaForCausalLM without q/k norm),
built from the config.json that `xtrain export` writes for the model (xtrain.io.export.hf_config)
and loaded from the model's float32 master weights, in the compute dtype. Two greedy generators
of it, the strongest a PyTorch user would reach for:

  hf_static     transformers' `generate(..., cache_implementation="static")`: a static KV cache
                whose decode step transformers compiles itself
  torch_static  a decode loop written against the same static cache: the model's forward for
                one new token per row under `torch.compile(mode="reduce-overhead", fullgraph=True)`
                (CUDA graphs), the prefill eager; `torch.compiler.cudagraph_mark_step_begin()`
                before each step and the picked tokens cloned out of the graph's output, which
                the next replay overwrites

Both return int64 (B, prompt + new) arrays like xtrain's generate, so the bench can compare the
tokens. No stop token: every row makes exactly max_new_tokens.
"""

from __future__ import annotations

import inspect

import numpy as np


def hf_model(model, device: str):
    """transformers' model with `model`'s weights (float32 masters cast to the compute dtype), eval."""
    import torch
    import transformers

    from xtrain.io.export import hf_config
    from xtrain.models.hf_import import hf_name

    config = model.config
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    cfg = hf_config(config, "bf16" if config.dtype == "bfloat16" else "f32", 0)
    cfg.pop("torch_dtype", None)
    hf_cfg = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device(device):
        peer = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    state = {hf_name(n): torch.from_numpy(np.asarray(p.numpy(), dtype=np.float32))
             for n, p in model.named_parameters()}
    missing, unexpected = peer.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"peer weights do not match: missing {sorted(set(missing) - tied)}, "
                           f"unexpected {sorted(unexpected)}")
    if config.tie_embeddings:
        peer.tie_weights()
    return peer.to(device=device, dtype=dtype).eval()


def hf_static_generate(peer, prompts: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """transformers' generate with its static cache (compiled decode), greedy, no stop token."""
    import torch

    ids = torch.as_tensor(prompts, device=peer.device)
    with torch.no_grad():
        out = peer.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                            min_new_tokens=max_new_tokens, do_sample=False, cache_implementation="static",
                            eos_token_id=None, pad_token_id=0)
    return out.cpu().numpy()


class StaticDecoder:
    """A hand-written greedy decode loop over transformers' StaticCache, its one-token step under
    torch.compile(mode="reduce-overhead"); one instance per (batch, cache length), reused across
    calls (the cache is reset), as xtrain keeps its decode graph."""

    def __init__(self, peer, batch: int, max_len: int):
        import torch
        import transformers

        self.peer, self.batch, self.max_len = peer, batch, max_len
        self.cache = _static_cache(transformers.StaticCache, peer, batch, max_len)
        self.step = torch.compile(self._forward, mode="reduce-overhead", fullgraph=True)

    def _forward(self, ids, position):
        out = self.peer(input_ids=ids, position_ids=position[None].expand(ids.shape[0], 1),
                        cache_position=position, past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1, :].argmax(-1)

    def __call__(self, prompts: np.ndarray, max_new_tokens: int) -> np.ndarray:
        import torch

        B, P = prompts.shape
        if B != self.batch or P + max_new_tokens > self.max_len:
            raise ValueError(f"StaticDecoder for batch {self.batch}, length {self.max_len}: got {B} x "
                             f"({P} + {max_new_tokens})")
        dev = self.peer.device
        self.cache.reset()
        ids = torch.as_tensor(prompts, device=dev)
        made = torch.empty((B, max_new_tokens), dtype=torch.long, device=dev)
        with torch.no_grad():
            pos = torch.arange(P, device=dev)
            logits = self.peer(input_ids=ids, position_ids=pos[None].expand(B, P), cache_position=pos,
                               past_key_values=self.cache, use_cache=True).logits
            nxt = logits[:, -1, :].argmax(-1)
            made[:, 0] = nxt
            for t in range(1, max_new_tokens):
                torch.compiler.cudagraph_mark_step_begin()
                nxt = self.step(nxt[:, None], torch.tensor([P + t - 1], device=dev)).clone()
                made[:, t] = nxt
        return np.concatenate([prompts, made.cpu().numpy()], axis=1)


def _static_cache(cls, peer, batch: int, max_len: int):
    """transformers.StaticCache for `peer` across its constructor's versions (max_batch_size and
    device/dtype are keywords of some versions and gone from others)."""
    params = inspect.signature(cls.__init__).parameters
    kw = {"config": peer.config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", peer.device),
                        ("dtype", peer.dtype)):
        if name in params:
            kw[name] = value
    return cls(**kw)
