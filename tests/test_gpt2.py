"""GPT-2 (xtrain.models.gpt2) against Hugging Face's GPT2LMHeadModel on the same weights (logits,
loss, every parameter gradient, a few AdamW steps against torch.optim.AdamW), against a
nanoGPT-style model written here in torch (the loss over the first steps in float32 from the
same init and data), and its own invariants: recompute bitwise, run-to-run bitwise, the fused
residual adds bitwise the plain blocks, bf16 near float32, the padded vocabulary never
predicted, GPT-2's init, the presets, and the architecture registry.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xtrain
from xtrain import models, nn
from xtrain.models import GPT2, GPT2Config, hf_gpt2
from xtrain.optim import AdamW
from ophelp import bits

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, max_seq=32)


def _randomized(config, device="cpu", seed=0):
    """A GPT2 whose every parameter (biases and norms too) holds random values, so the name and
    layout mapping is exercised by all of them."""
    model = GPT2(config, device=device, seed=seed)
    g = np.random.default_rng(seed + 1)
    state = {}
    for name, p in model.named_parameters():
        base = 1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight" else 0.0
        state[name] = (base + 0.05 * g.standard_normal(tuple(p.shape))).astype(np.float32)
    model.load_state_dict(state)
    return model, state


def _hf_model(config, state):
    hf_config = transformers.GPT2Config(**{k: v for k, v in hf_gpt2.hf_config(config, "float32", 0).items()
                                           if k not in ("architectures", "torch_dtype")})
    hf_config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in hf_gpt2.hf_tensors(state, config).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all(k == "lm_head.weight" or k.endswith(".attn.bias") for k in missing), missing
    return model


def _batch(config, B=2, S=16, seed=3):
    g = np.random.default_rng(seed)
    return g.integers(0, config.vocab_size, (B, S)), g.integers(0, config.vocab_size, (B, S))


def _hf_grads_as_ours(hf_model, config):
    grads = {n: p.grad.detach().numpy() for n, p in hf_model.named_parameters()}
    return hf_gpt2.params_from_hf(grads, config, "grads", _fail)


def _fail(message):
    raise AssertionError(message)


def test_logits_loss_and_every_gradient_match_transformers():
    config = GPT2Config(**SMALL)
    model, state = _randomized(config)
    hf = _hf_model(config, state)
    ids, targets = _batch(config)
    logits, _ = model(ids)
    ref = hf(torch.from_numpy(ids)).logits
    np.testing.assert_allclose(logits.numpy().reshape(ref.shape), ref.detach().numpy(), rtol=1e-4, atol=2e-5)

    _, loss = model(ids, targets)
    loss.backward()
    ref_loss = F.cross_entropy(ref.reshape(-1, config.vocab_size), torch.from_numpy(targets).reshape(-1))
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 2e-5
    ref_grads = _hf_grads_as_ours(hf, config)
    for name, p in model.named_parameters():
        expected = ref_grads[name]
        got = np.zeros_like(expected) if p.grad is None else p.grad.numpy()
        # k_proj's bias takes a gradient of zero up to rounding (softmax ignores a shift of every
        # score of a query): an absolute floor for it
        atol = max(2e-5 * np.abs(expected).max(), 1e-8)
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=atol, err_msg=name)
    assert model.wte.pad.grad is None or not np.any(model.wte.pad.grad.numpy())


def test_adamw_steps_match_transformers_and_torch_adamw():
    config = GPT2Config(**SMALL)
    model, state = _randomized(config, seed=5)
    hf = _hf_model(config, state)
    opt = AdamW(model.named_parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    no_decay = [p for p in hf.parameters() if p.dim() < 2]
    ref_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    for step in range(4):
        ids, targets = _batch(config, seed=10 + step)
        _, loss = model(ids, targets)
        loss.backward()
        opt.step()
        model.zero_grad()
        ref_opt.zero_grad()
        ref_logits = hf(torch.from_numpy(ids)).logits
        ref_loss = F.cross_entropy(ref_logits.reshape(-1, config.vocab_size), torch.from_numpy(targets).reshape(-1))
        ref_loss.backward()
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) < 1e-4, step
    theirs = hf_gpt2.params_from_hf({n: p.detach().numpy() for n, p in hf.named_parameters()}, config, "hf", _fail)
    for name, p in model.named_parameters():
        if name == "wte.pad":  # llm.c's padded rows: no gradient reaches them (transformers has none)
            continue
        if name.endswith("k_proj.bias"):  # its gradient is rounding noise, which Adam scales to lr-sized steps
            continue
        np.testing.assert_allclose(p.numpy(), theirs[name], rtol=1e-4, atol=2e-5, err_msg=name)


# ---- a nanoGPT-style GPT-2 in torch, written for this test (its model.py's structure and init)

class _TorchBlock(torch.nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.attn_proj = torch.nn.Linear(C, C)
        self.c_fc, self.mlp_proj = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, S, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, C)
        x = x + self.attn_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class _TorchGPT(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = torch.nn.Embedding(c.vocab_size, c.dim)
        self.wpe = torch.nn.Embedding(c.max_seq, c.dim)
        self.h = torch.nn.ModuleList(_TorchBlock(c.dim, c.n_heads) for _ in range(c.n_layers))
        self.ln_f = torch.nn.LayerNorm(c.dim)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def load_from(self, params, c):
        """Our parameters (the xtrain model's, same init) into this layout."""
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
                own[name].copy_(torch.from_numpy(params[name]))
            for i in range(c.n_layers):
                p = f"h.{i}."
                for a, b in (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("attn_proj", "attn.c_proj"), ("c_fc", "mlp.c_fc"),
                             ("mlp_proj", "mlp.c_proj")):
                    own[p + a + ".weight"].copy_(torch.from_numpy(params[p + b + ".weight"]))
                    own[p + a + ".bias"].copy_(torch.from_numpy(params[p + b + ".bias"]))
                qkv = [params[p + f"attn.{j}_proj.weight"] for j in "qkv"]
                own[p + "c_attn.weight"].copy_(torch.from_numpy(np.concatenate(qkv)))
                own[p + "c_attn.bias"].copy_(torch.from_numpy(np.concatenate([params[p + f"attn.{j}_proj.bias"]
                                                                              for j in "qkv"])))


def test_loss_matches_a_nanogpt_style_model_over_the_first_steps():
    """From xtrain's own GPT-2 init (std 0.02, residual projections / sqrt(2L), zero biases), the
    same data: the float32 losses of 5 AdamW steps agree to float rounding."""
    config = GPT2Config(**SMALL)
    model = GPT2(config, seed=11)
    init = {n: p.numpy().copy() for n, p in model.named_parameters()}
    ref = _TorchGPT(config)
    ref.load_from(init, config)
    opt = AdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ref_opt = torch.optim.AdamW([{"params": [p for p in ref.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                                 {"params": [p for p in ref.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    data = np.random.default_rng(12).integers(0, config.vocab_size, 4 * 17 * 5)
    for step in range(5):
        chunk = data[step * 68:(step + 1) * 68].reshape(4, 17)
        ids, targets = chunk[:, :-1], chunk[:, 1:]
        _, loss = model(ids, targets)
        loss.backward()
        opt.step()
        model.zero_grad()
        ref_opt.zero_grad()
        ref_loss = ref(torch.from_numpy(ids), torch.from_numpy(targets))
        ref_loss.backward()
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) < 1e-5 * max(1.0, ref_loss.item()), (step, loss.item(),
                                                                                      ref_loss.item())


def test_init_follows_gpt2():
    config = GPT2Config(vocab_size=1000, dim=128, n_layers=6, n_heads=4, max_seq=64)
    model = GPT2(config, seed=0)
    params = dict(model.named_parameters())
    resid = 0.02 / math.sqrt(2 * config.n_layers)
    for name, p in params.items():
        a = p.numpy()
        if name.endswith(".bias"):
            assert not a.any(), name
        elif "ln_" in name:
            assert np.all(a == 1), name
        else:
            std = resid if name.endswith("c_proj.weight") else 0.02
            assert abs(a.std() - std) < 0.1 * std, (name, a.std(), std)
    assert config.padded_vocab_size == 1024 and params["wte.pad"].shape == (24, 128)
    assert GPT2Config(vocab_size=50257, dim=768, n_layers=12, n_heads=12).padded_vocab_size == 50304


def _train_steps(config, device="cpu", steps=2, seed=7):
    model = GPT2(config, device=device, seed=seed)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    out = []
    for step in range(steps):
        ids, targets = _batch(config, seed=20 + step)
        _, loss = model(xtrain.tensor(ids, device=device), xtrain.tensor(targets, device=device))
        loss.backward()
        out.append(bits(loss))
        out.extend(bits(p.grad) for p in model.parameters() if p.grad is not None)
        opt.step()
        model.zero_grad()
    out.extend(bits(p) for p in model.parameters())
    return out


@pytest.mark.parametrize("bf16", [False, True])
def test_recompute_is_bitwise_exact_and_runs_repeat(device, bf16):
    plain = _train_steps(GPT2Config(**SMALL, bf16=bf16), device)
    again = _train_steps(GPT2Config(**SMALL, bf16=bf16), device)
    recomputed = _train_steps(GPT2Config(**SMALL, bf16=bf16, recompute=True), device)
    assert len(plain) == len(recomputed)
    for i, (a, b, c) in enumerate(zip(plain, again, recomputed)):
        assert np.array_equal(a, b), f"array {i} differs run to run"
        assert np.array_equal(a, c), f"array {i} differs with recompute"


def test_fused_residual_adds_equal_the_plain_blocks(device):
    """The forward over nn.ResidualStream (each add fused into the next LayerNorm) gives the bits
    of the blocks over plain tensors."""
    config = GPT2Config(**SMALL)
    ids, targets = _batch(config)
    results = []
    for fused in (True, False):
        model = GPT2(config, device=device, seed=2)
        if fused:
            _, loss = model(xtrain.tensor(ids, device=device), xtrain.tensor(targets, device=device))
        else:
            B, S = ids.shape
            x = model.embed(xtrain.tensor(ids, device=device), xtrain.arange(0, S, dtype="int64", device=device))
            for block in model.h:
                x = block(x, S)
            loss, _ = xtrain.ops.linear_cross_entropy(model.ln_f(x), model.wte.weight,
                                                      xtrain.tensor(targets.reshape(-1), device=device))
        loss.backward()
        results.append([bits(loss)] + [bits(p.grad) for p in model.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_bf16_tracks_float32(device):
    ids, targets = _batch(GPT2Config(**SMALL))
    losses = []
    for bf16 in (False, True):
        model = GPT2(GPT2Config(**SMALL, bf16=bf16), device=device, seed=4)
        _, loss = model(xtrain.tensor(ids, device=device), xtrain.tensor(targets, device=device))
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 0.02 * losses[0]


def test_padded_rows_are_never_predicted():
    config = GPT2Config(**SMALL)
    model = GPT2(config)
    logits, _ = model(np.zeros((1, 4), dtype=np.int64))
    assert logits.shape == (4, config.vocab_size)  # the real vocabulary only
    with pytest.raises(IndexError):
        model(np.full((1, 4), config.vocab_size, dtype=np.int64))  # a padded id is no token


def test_overfits_a_fixed_batch():
    config = GPT2Config(**SMALL)
    model = GPT2(config, seed=1)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.0)
    ids, targets = _batch(config, B=2, S=8)
    first = None
    for _ in range(40):
        _, loss = model(ids, targets)
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
        model.zero_grad()
    assert loss.item() < 0.2 * first


def test_presets_and_registry():
    sizes = {"gpt2-124m": 124.4e6, "gpt2-350m": 354.8e6, "gpt2-774m": 774.0e6, "gpt2-1.5b": 1557.6e6}
    for name, expected in sizes.items():
        c = models.preset_config(name, 50257)
        assert isinstance(c, GPT2Config) and c.head_dim == 64 and c.padded_vocab_size == 50304
        n = sum(math.prod(s) for k, s in c.param_shapes().items() if k != "wte.pad")
        assert abs(n - expected) < 0.005 * expected, (name, n)
        assert models.config_from_dict(c.to_dict()) == c
        assert models.model_class(c) is GPT2
    assert models.arch_of({"dim": 8}) == "qwen3"  # records older than the registry
    qwen = models.preset_config("tiny", 256)
    assert models.config_from_dict(qwen.to_dict()) == qwen and models.model_class(qwen) is models.TinyTransformer
    with pytest.raises(ValueError, match="unknown model architecture"):
        models.config_from_dict({"arch": "mamba"})
    with pytest.raises(ValueError, match="unknown preset"):
        models.preset_config("gpt2-7b", 50257)


def test_config_errors():
    with pytest.raises(ValueError, match="must divide dim"):
        GPT2Config(vocab_size=10, dim=30, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match="padded_vocab_size"):
        GPT2Config(vocab_size=10, dim=8, n_layers=1, n_heads=2, padded_vocab_size=5)
    with pytest.raises(ValueError, match="dropout"):
        GPT2Config(vocab_size=10, dim=8, n_layers=1, n_heads=2, dropout=1.0)
    with pytest.raises(ValueError, match="unknown GPT2Config fields"):
        GPT2Config.from_dict({"arch": "gpt2", "vocab_size": 10, "dim": 8, "n_layers": 1, "n_heads": 2, "ffn": 3})
    with pytest.raises(ValueError, match="max_seq"):
        GPT2(GPT2Config(**SMALL))(np.zeros((1, 33), dtype=np.int64))


def test_layer_norm_and_biased_linear_modules(device):
    ln = nn.LayerNorm(8).to(device)
    lin = nn.Linear(8, 3, bias=True).to(device)
    x = xtrain.tensor(np.random.default_rng(0).standard_normal((5, 8)), dtype="float32", device=device)
    y = lin(ln(x))
    ref = F.linear(F.layer_norm(torch.from_numpy(x.numpy()), (8,)), torch.from_numpy(lin.weight.numpy()),
                   torch.from_numpy(lin.bias.numpy()))
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]


@pytest.mark.parametrize("bf16", [False, True])
def test_generate_with_kv_cache_matches_full_forwards(device, bf16):
    """Greedy tokens from the KV cache (prefill, then decode steps at each row's own position, rows
    of different lengths) equal the argmax of full forwards over the growing sequences."""
    config = GPT2Config(**SMALL, bf16=bf16)
    model, _ = _randomized(config, device=device, seed=8)
    prompts = [[5, 17, 33, 2, 9], [250, 3]]
    out = model.generate(prompts, max_new_tokens=6, greedy=True)
    for b, prompt in enumerate(prompts):
        seq = list(prompt)
        for _ in range(6):
            logits, _ = model(np.array([seq]))
            seq.append(int(np.argmax(logits.numpy()[-1].astype(np.float64))))
        assert list(out[b, :len(seq)]) == seq, (b, out[b], seq)
    sampled = model.generate(prompts, max_new_tokens=4, temperature=0.8, top_k=20, seed=3)
    again = model.generate(prompts, max_new_tokens=4, temperature=0.8, top_k=20, seed=3)
    assert np.array_equal(sampled, again)


def test_generate_stops_at_max_seq():
    config = GPT2Config(**{**SMALL, "max_seq": 8})
    out = GPT2(config).generate([[1, 2, 3]], max_new_tokens=20, greedy=True)
    assert out.shape == (1, 8)


needs_gpu = pytest.mark.skipif(not xtrain.cuda.is_available(),
                               reason="needs a CUDA GPU (the lead runs these on the H200)")


@needs_gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_cuda_graph_steps_equal_eager_steps(bf16, recompute):
    """The training step as replayed CUDA graphs (xtrain.graphs, as `xtrain train` runs it) gives
    the eager steps' losses, norms and weights, bitwise (the positions come from xtrain.arange on
    the device: nothing from the host inside the capture)."""
    from xtrain import graphs

    config = GPT2Config(**SMALL, bf16=bf16, recompute=recompute)
    g = np.random.default_rng(2)
    batches = [tuple(xtrain.tensor(g.integers(0, config.vocab_size, (2, 16)), device="cuda") for _ in range(2))
               for _ in range(6)]
    results = []
    for use_graphs in (False, True):
        model = GPT2(config, device="cuda", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-3)
        sg = graphs.StepGraphs(model, opt, 1, 1.0, blocked=None if use_graphs else "eager", note=lambda m: None)
        values = []
        for x, y in batches:
            out = sg.step(x, y)
            if out is None:
                loss = graphs.forward_backward(model, x, y, 1)
                norm = opt.clip_and_step(1.0, loss)
                opt.zero_grad(set_to_none=True)
                sg.eager()
                values.append((loss.item(), norm.item()))
            else:
                values.append((out[0].item(), out[1].item()))
        assert sg.active == use_graphs
        results.append((values, [p.numpy().copy() for p in model.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        assert np.array_equal(a, b)
