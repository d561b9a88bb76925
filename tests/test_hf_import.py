"""Import of Hugging Face Qwen3 and Llama directories (xtrain.models.hf_import, TinyTransformer.
from_pretrained, `xtrain train --init-from`): small random models built and saved by transformers
itself (no downloads), their float32 logits against transformers' forward, import -> export bit for
bit, sharded files, training from an imported model, and bad inputs."""

import json
import shutil

import numpy as np
import pytest

from modelhelp import bits_equal, run_cli
from xtrain.models import hf_import
from xtrain.io import state
from xtrain.data import generate_stories, prepare, train_bpe, write_corpus
from xtrain.io.export import export
from xtrain.models import TinyTransformer, TransformerConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402  (after the skips)

# name -> (architecture, the transformers config's options). Hidden size 32, 2 layers, ffn 48.
CASES = {
    "qwen3-gqa": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                tie_word_embeddings=False, rope_theta=1e6)),
    "qwen3-tied": ("qwen3", dict(num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                 tie_word_embeddings=True)),
    # head_dim not given: hidden_size / heads = 8
    "llama-mqa-tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-untied": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                   tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=5e5)),
}
VOCAB_PAD = 16  # real checkpoints pad the embedding beyond the tokenizer's ids


@pytest.fixture(scope="module")
def tok():
    return train_bpe(generate_stories(200), 320)


def _hf_model(kind: str, options: dict, vocab_size: int, seed: int = 0):
    """A random transformers model (float32) with weights large enough that logits differ."""
    config_cls = transformers.Qwen3Config if kind == "qwen3" else transformers.LlamaConfig
    config = config_cls(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        max_position_embeddings=64, **options)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return model.eval()


def _save(model, path, tok, **kwargs):
    model.save_pretrained(path, **kwargs)
    for name, data in tok.hf_files(model_max_length=64).items():
        (path / name).write_bytes(data)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tok):
    """case -> (transformers model, its float32 directory)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, (kind, options) in CASES.items():
        model = _hf_model(kind, options, tok.vocab_size + VOCAB_PAD)
        out[name] = (model, _save(model, root / name, tok))
    return out


def _ids(vocab_size, B=2, S=12, seed=4):
    return np.random.default_rng(seed).integers(0, vocab_size, size=(B, S), dtype=np.int64)


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.double().numpy().reshape(ids.size, -1)


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(saved, device, case):
    hf, path = saved[case]
    model = TinyTransformer.from_pretrained(path, device=device)
    c, hc = model.config, hf.config
    assert (c.n_heads, c.n_kv_heads, c.head_dim) == (hc.num_attention_heads, hc.num_key_value_heads,
                                                     getattr(hc, "head_dim", None) or 32 // hc.num_attention_heads)
    assert c.tie_embeddings == hc.tie_word_embeddings and c.qk_norm == (CASES[case][0] == "qwen3")
    assert c.norm_eps == hc.rms_norm_eps
    ids = _ids(c.vocab_size)
    ours, _ = model(ids)
    want = _hf_logits(hf, ids)
    got = np.asarray(ours.numpy(), np.float64)
    scale = np.abs(want).max()
    assert scale > 1  # logits large enough to mean something
    # float32 rounding only (RoPE's angles and the reduction orders differ): measured on the CPU
    # at most 3.4e-6 of the largest logit
    tol = 1e-5 if device == "cpu" else 3e-5
    err = np.abs(got - want).max() / scale
    assert err < tol, f"largest logit difference {err:.2e} of the largest logit"


def test_from_pretrained_carries_tokenizer_and_options(saved, tok):
    _, path = saved["qwen3-gqa"]
    model = TinyTransformer.from_pretrained(path, dtype="bfloat16", recompute=True, max_seq=32)
    assert model.tokenizer.fingerprint == hf_import.read_tokenizer(path, 10**6).fingerprint
    assert model.tokenizer.encode("Lily was happy.") == tok.encode("Lily was happy.")
    assert model.config.bf16 and model.config.recompute and model.config.max_seq == 32
    assert model.config.rope_theta == 1e6
    logits, _ = model(_ids(model.config.vocab_size))
    assert logits.dtype == "bfloat16"
    assert TinyTransformer.from_pretrained(path, bf16=True).config.bf16
    assert TinyTransformer(model.config).tokenizer is None
    with pytest.raises(ValueError, match="dtype must be float32 or bfloat16"):
        TinyTransformer.from_pretrained(path, dtype="float16")


def test_sharded_directory_imports_the_same_weights(saved, tmp_path, tok):
    hf, path = saved["llama-untied"]
    sharded = _save(hf, tmp_path / "sharded", tok, max_shard_size="20KB")
    assert (sharded / hf_import.INDEX_FILE).is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    a = hf_import.read_pretrained(path, TransformerConfig)
    b = hf_import.read_pretrained(sharded, TransformerConfig)
    assert a.config == b.config and list(a.tensors) != [] and set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        assert bits_equal(a.tensors[name], b.tensors[name]), name


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_import_then_export_is_bit_identical(saved, tmp_path, tok, case, dtype):
    hf, path = saved[case]
    if dtype == "bf16":  # a bf16 checkpoint: exported in bf16, the same bits come back
        import copy

        path = _save(copy.deepcopy(hf).to(torch.bfloat16), tmp_path / "bf16", tok)
    model = TinyTransformer.from_pretrained(path)
    state.save(tmp_path / "ckpt", model, None, 0, tokenizer=model.tokenizer)
    out = export(tmp_path / "ckpt", tmp_path / "out", dtype=dtype)

    src, dst = load_file(str(path / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(src) == sorted(dst)  # tied: no lm_head.weight in either
    assert ("lm_head.weight" in dst) != hf.config.tie_word_embeddings
    for name in src:
        assert src[name].dtype == dst[name].dtype and torch.equal(src[name].view(torch.uint8),
                                                                  dst[name].view(torch.uint8)), name
    # an equivalent config: the same model when read back, and the same fields in transformers
    assert hf_import.read_pretrained(out, TransformerConfig).config == hf_import.read_pretrained(path, TransformerConfig).config
    theirs = transformers.AutoConfig.from_pretrained(out)
    assert theirs.model_type == hf.config.model_type and theirs.architectures == hf.config.architectures
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(theirs, key) == getattr(hf.config, key), key
    assert _rope_theta(theirs) == _rope_theta(hf.config)
    # the tokenizer travels unchanged, and transformers runs the export like the source
    assert (out / "tokenizer.json").read_bytes() == (path / "tokenizer.json").read_bytes()
    if dtype == "f32":
        back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        ids = _ids(model.config.vocab_size)
        np.testing.assert_array_equal(_hf_logits(back, ids), _hf_logits(hf, ids))


def _rope_theta(config):
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", None))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_training_from_an_imported_model(saved, dtype):
    """A few AdamW steps from imported weights (GQA, tied, no q/k norm): finite, falling loss, and
    recompute bitwise equal to the plain path, step after step."""
    from xtrain.optim import AdamW

    _, path = saved["llama-mqa-tied"]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 300, size=(4, 16), dtype=np.int64)
    y = np.roll(x, -1, axis=1)
    runs = []
    for recompute in (False, True):
        model = TinyTransformer.from_pretrained(path, bf16=dtype == "bfloat16", recompute=recompute)
        opt = AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.0)
        losses = []
        for _ in range(4):
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs.append((losses, model.store.params.numpy().copy()))
    (losses, params), (losses_r, params_r) = runs
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert losses == losses_r and bits_equal(params, params_r)


# ---- the CLI

CLI_ARGS = ("--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "4", "--no-progress",
            "--device", "cpu", "--warmup", "1", "--decay-steps", "6")


def _final_weights(run_dir):
    return state.load(run_dir / "ckpt").model_tensors()


def test_cli_train_init_from_end_to_end_and_resume(saved, tmp_path):
    _, path = saved["qwen3-gqa"]
    corpus = write_corpus(tmp_path / "stories.txt", 700_000)  # 2 validation documents
    # run a tokenizes the raw text with the model's tokenizer; run b reads a copy prepared with it
    data = prepare(corpus, tmp_path / "data", tokenizer=path, progress=False)
    straight = run_cli("train", "--init-from", path, "--data", corpus, "--out", tmp_path / "a", "--steps", 6,
                       *CLI_ARGS)
    assert straight.returncode == 0, straight.stderr
    assert "from pretrained Qwen3ForCausalLM weights" in straight.stdout
    log = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 6 and all(np.isfinite(losses)) and log[0]["lr"] < 1e-4 + 1e-12
    model = TinyTransformer.from_pretrained(path)
    ckpt = state.load(tmp_path / "a" / "ckpt")
    assert ckpt.step == 6 and ckpt.config.n_kv_heads == 2 and ckpt.config.rope_theta == 1e6
    assert ckpt.tokenizer().fingerprint == model.tokenizer.fingerprint  # the checkpoint carries it
    assert ckpt.meta["train_args"]["init_from"] == str(path.resolve())

    first = run_cli("train", "--init-from", path, "--data", data, "--out", tmp_path / "b", "--steps", 3,
                    *CLI_ARGS)
    assert first.returncode == 0, first.stderr
    resumed = run_cli("train", "--out", tmp_path / "b", "--resume", "--steps", 6, "--no-progress",
                      "--sample-tokens", "4")
    assert resumed.returncode == 0, resumed.stderr
    a, b = _final_weights(tmp_path / "a"), _final_weights(tmp_path / "b")
    assert list(a) == list(b)
    for name in a:
        assert bits_equal(a[name], b[name]), name


def _cli_error(*args):
    r = run_cli("train", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("xtrain: error: "), r.stderr
    return lines[0]


def test_cli_init_from_errors(saved, tmp_path):
    _, path = saved["qwen3-tied"]
    assert "no such directory" in _cli_error("--init-from", tmp_path / "missing", "--out", tmp_path / "o1")
    assert "--resume" in _cli_error("--init-from", path, "--resume", tmp_path / "x", "--out", tmp_path / "o2")
    assert "drop --preset tiny" in _cli_error("--init-from", path, "--preset", "tiny", "--out", tmp_path / "o3")
    # the built-in stories use their own BPE, not the model's tokenizer
    msg = _cli_error("--init-from", path, "--out", tmp_path / "o4", "--steps", "1", "--no-progress")
    assert "the model's tokenizer is hf-" in msg and "--tokenizer" in msg


# ---- bad directories

def _copy(saved, case, tmp_path):
    return shutil.copytree(saved[case][1], tmp_path / case)


def _edit_config(path, **changes):
    f = path / "config.json"
    config = json.loads(f.read_text())
    config.update(changes)
    f.write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    (dict(architectures=["GPT2LMHeadModel"]), r"a GPT-2 model \(GPT2LMHeadModel\); GPT2.from_pretrained reads it"),
    (dict(architectures=["GPT2Model"]), r"architecture \['GPT2Model'\] is not supported"),
    (dict(architectures=None, model_type="mistral"), "model_type 'mistral' is not supported"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 8.0}), "RoPE scaling .*'linear'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "llama3' has no low_freq_factor"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 0.5, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 64}), "factor must be >= 1"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "RoPE scaling .*'yarn'"),
    (dict(attention_bias=True), "attention_bias = true"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(use_sliding_window=True, sliding_window=16), "sliding-window attention"),
    (dict(num_experts=8), "mixture of experts"),
    (dict(head_dim=512), "head_dim 512"),
    (dict(num_key_value_heads=3), "num_key_value_heads 3 must divide num_attention_heads 4"),
    (dict(intermediate_size=64), r"tensor model\.layers\.0\.mlp\.\w+_proj\.weight has shape \[.*48.*\]; the config implies \[.*64.*\]"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings is true but lm_head.weight differs"),
])
def test_unsupported_or_inconsistent_configs(saved, tmp_path, changes, message):
    path = _copy(saved, "qwen3-gqa", tmp_path)
    _edit_config(path, **changes)
    with pytest.raises(hf_import.PretrainedError, match=message):
        TinyTransformer.from_pretrained(path)


def test_bad_directories(saved, tmp_path):
    with pytest.raises(hf_import.PretrainedError, match="no such directory"):
        hf_import.read_pretrained(tmp_path / "missing", TransformerConfig)
    path = _copy(saved, "llama-untied", tmp_path)
    (path / "config.json").rename(path / "other.json")
    with pytest.raises(hf_import.PretrainedError, match="no config.json"):
        hf_import.read_pretrained(path, TransformerConfig)
    (path / "other.json").rename(path / "config.json")

    tensors = load_file(str(path / "model.safetensors"))
    weights = path / "model.safetensors"
    save_file({k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}, str(weights))
    with pytest.raises(hf_import.PretrainedError, match="missing tensors model.layers.1.mlp.up_proj.weight"):
        hf_import.read_pretrained(path, TransformerConfig)
    save_file({**tensors, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, str(weights))
    with pytest.raises(hf_import.PretrainedError, match="no place for .*q_proj.bias"):
        hf_import.read_pretrained(path, TransformerConfig)
    save_file({**tensors, "model.embed_tokens.weight": tensors["model.embed_tokens.weight"].half()}, str(weights))
    assert hf_import.read_pretrained(path, TransformerConfig).dtype == "f16"  # F16 widens exactly
    save_file({**tensors, "model.norm.weight": tensors["model.norm.weight"].double()}, str(weights))
    with pytest.raises(hf_import.PretrainedError, match="model.norm.weight is F64"):
        hf_import.read_pretrained(path, TransformerConfig)
    weights.write_bytes(b"\x00" * 4)
    with pytest.raises(hf_import.PretrainedError, match="not a readable safetensors file"):
        hf_import.read_pretrained(path, TransformerConfig)
    weights.unlink()
    with pytest.raises(hf_import.PretrainedError, match="no model.safetensors"):
        hf_import.read_pretrained(path, TransformerConfig)
    (path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(hf_import.PretrainedError, match="pickle"):
        hf_import.read_pretrained(path, TransformerConfig)


def test_tokenizer_larger_than_the_model_is_refused(saved, tmp_path, tok):
    hf = _hf_model("qwen3", CASES["qwen3-gqa"][1], tok.vocab_size - 8)
    path = _save(hf, tmp_path / "small-vocab", tok)
    with pytest.raises(hf_import.PretrainedError, match="beyond the model's vocab_size"):
        hf_import.read_pretrained(path, TransformerConfig)
    assert hf_import.read_pretrained(path, TransformerConfig, tokenizer=False).tokenizer is None
