"""GPT-2's checkpoints both ways: xtrain's own (the config record names the architecture; save,
load, resume bit-exact), export to a Hugging Face GPT2LMHeadModel directory (transformers loads it
with the same logits and greedy tokens) and import back (from_pretrained, also from the original
checkpoints' unprefixed names), and llm.c's model file in float32 and bfloat16 (read, written, the
same bytes back; bad files refused).
"""
import json

import numpy as np
import pytest
import torch

import xtrain
from xtrain.data import generate_stories, train_bpe
from xtrain.io import llmc, state
from xtrain.io.export import export, safetensors_bytes
from xtrain.models import GPT2, GPT2Config, hf_import
from xtrain.optim import AdamW

transformers = pytest.importorskip("transformers")
PROMPT = "Once upon a time"


def _config(vocab_size=300, **kw):
    return GPT2Config(vocab_size=vocab_size, dim=64, n_layers=2, n_heads=4, max_seq=64, **kw)


def _model(config, seed=3):
    """A GPT2 with weights large enough that greedy choices are clear."""
    model = GPT2(config, seed=seed)
    g = np.random.default_rng(seed)
    model.load_state_dict({n: (p.numpy() * 5 + (0.02 * g.standard_normal(p.shape) if n.endswith("bias") else 0))
                           .astype(np.float32) for n, p in model.named_parameters()})
    return model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2ckpt")
    tok = train_bpe(generate_stories(200), 320)
    model = _model(_config(tok.vocab_size))
    state.save(root / "ckpt", model, None, 0, tokenizer=tok)
    return root, model, tok


def test_checkpoint_records_the_architecture_and_loads_back(run):
    root, model, _ = run
    meta = json.loads((root / "ckpt" / "state.json").read_text())
    assert meta["config"]["arch"] == "gpt2"
    ckpt = state.load(root / "ckpt")
    assert ckpt.config == model.config
    back = ckpt.build_model("cpu", bf16=True)
    assert isinstance(back, GPT2) and back.config.bf16
    for (n, a), (m, b) in zip(model.named_parameters(), back.named_parameters()):
        assert n == m and np.array_equal(a.numpy(), b.numpy())


def test_resume_is_bit_exact(tmp_path):
    config = _config()
    g = np.random.default_rng(0)
    batches = [g.integers(0, config.vocab_size, (2, 17)) for _ in range(4)]

    def steps(model, opt, chunk):
        for b in chunk:
            _, loss = model(b[:, :-1], b[:, 1:])
            loss.backward()
            opt.step()
            model.zero_grad()

    model = GPT2(config, seed=1)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    steps(model, opt, batches[:2])
    state.save(tmp_path / "ckpt", model, opt, 2)
    steps(model, opt, batches[2:])
    ckpt = state.load(tmp_path / "ckpt")
    resumed = ckpt.build_model("cpu")
    opt2 = AdamW(resumed.named_parameters(), lr=1e-3)
    ckpt.load_optimizer(opt2)
    steps(resumed, opt2, batches[2:])
    for (n, a), (_, b) in zip(model.named_parameters(), resumed.named_parameters()):
        assert np.array_equal(a.numpy(), b.numpy()), n


def test_export_loads_in_transformers_with_matching_logits_and_greedy_tokens(run):
    root, model, tok = run
    out = export(root / "ckpt", root / "hf-f32", dtype="f32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["n_embd"] == 64
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    ids = np.random.default_rng(4).integers(0, tok.vocab_size, (2, 12))
    ours, _ = model(ids)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits.reshape(-1, tok.vocab_size)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-4)
    prompt = tok.encode(PROMPT)
    greedy = model.generate([prompt], 20, greedy=True)[0, len(prompt):]
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        hf_out = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                             pad_token_id=tok.eot_id)[0, len(prompt):]
    assert greedy.tolist() == hf_out.tolist()
    assert transformers.AutoTokenizer.from_pretrained(out).encode(PROMPT) == tok.encode(PROMPT)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_import_then_export_is_bit_identical(run, tmp_path, dtype):
    root, model, tok = run
    out = export(root / "ckpt", tmp_path / "hf", dtype=dtype)
    back = GPT2.from_pretrained(out)
    assert back.config == model.config and back.tokenizer is not None
    if dtype == "f32":
        for (n, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
            if n != "wte.pad":  # not in Hugging Face's layout: imported as zeros
                assert np.array_equal(a.numpy(), b.numpy()), n
    state.save(tmp_path / "ckpt2", back, None, 0, tokenizer=back.tokenizer)
    again = export(tmp_path / "ckpt2", tmp_path / "hf2", dtype=dtype)
    assert (out / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()


def test_import_reads_the_original_unprefixed_names(run, tmp_path):
    """openai-community/gpt2's file has no "transformer." prefix and carries the causal-mask
    buffers attn.bias; both are read."""
    root, model, tok = run
    out = export(root / "ckpt", tmp_path / "hf", dtype="f32")
    tensors = hf_import.read_weights(out)[0]
    renamed = {n.removeprefix("transformer."): a for n, a in tensors.items()}
    renamed["h.0.attn.bias"] = np.tril(np.ones((64, 64), np.float32))[None, None]
    (out / "model.safetensors").write_bytes(safetensors_bytes(renamed, "f32"))
    back = GPT2.from_pretrained(out)
    assert np.array_equal(back.wte.weight.numpy(), model.wte.weight.numpy())


@pytest.mark.parametrize("change, message", [
    (dict(activation_function="relu"), "activation_function 'relu'"),
    (dict(n_inner=100), "n_inner 100"),
    (dict(scale_attn_by_inverse_layer_idx=True), "attention scaled"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings"),
    (dict(n_embd=60), "tensor wte.weight has shape"),
])
def test_unsupported_gpt2_configs_are_refused(run, tmp_path, change, message):
    root, _, _ = run
    out = export(root / "ckpt", tmp_path / "hf", dtype="f32")
    config = json.loads((out / "config.json").read_text())
    config.update(change)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(hf_import.PretrainedError, match=message):
        GPT2.from_pretrained(out)


def test_qwen3_and_gpt2_from_pretrained_refuse_each_other(run, tmp_path):
    root, _, _ = run
    out = export(root / "ckpt", tmp_path / "hf", dtype="f32")
    with pytest.raises(hf_import.PretrainedError, match="GPT2.from_pretrained reads it"):
        xtrain.models.TinyTransformer.from_pretrained(out)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_llmc_model_file_round_trip(tmp_path, dtype):
    config = GPT2Config(vocab_size=300, dim=64, n_layers=2, n_heads=4, max_seq=32)
    model = _model(config)
    path = llmc.save(tmp_path / f"gpt2_{dtype}.bin", model, dtype=dtype)
    header = np.fromfile(path, dtype="<i4", count=8)
    assert header.tolist() == [20240326, 3 if dtype == "f32" else 5, 32, 300, 2, 4, 64, 384]
    n = sum(int(np.prod(s)) for _, s in llmc.tensor_shapes(config))
    assert path.stat().st_size == 1024 + n * (4 if dtype == "f32" else 2)
    back_config, params, read_dtype = llmc.read(path)
    assert back_config == config and read_dtype == dtype
    for name, p in model.named_parameters():
        a = p.numpy()
        if dtype == "bf16":  # rounded to nearest even, as torch rounds
            a = torch.from_numpy(a).to(torch.bfloat16).float().numpy()
        assert np.array_equal(params[name], a), name
    loaded = llmc.load(path)
    again = llmc.save(tmp_path / "again.bin", loaded, dtype=dtype)
    assert again.read_bytes() == path.read_bytes()
    ids = np.random.default_rng(1).integers(0, 300, (1, 8))
    if dtype == "f32":
        np.testing.assert_array_equal(model(ids)[0].numpy(), loaded(ids)[0].numpy())


def test_llmc_layout_matches_the_stacked_tensors(tmp_path):
    """qkvw holds each layer's q, k and v rows in that order; wte's padded rows follow the real ones."""
    config = GPT2Config(vocab_size=130, dim=32, n_layers=2, n_heads=2, max_seq=16)
    model = _model(config)
    path = llmc.save(tmp_path / "m.bin", model)
    raw = np.fromfile(path, dtype="<f4", offset=1024)
    shapes = dict(llmc.tensor_shapes(config))
    offsets, off = {}, 0
    for name, shape in llmc.tensor_shapes(config):
        offsets[name] = off
        off += int(np.prod(shape))
    qkvw = raw[offsets["qkvw"]:offsets["qkvb"]].reshape(shapes["qkvw"])
    assert np.array_equal(qkvw[1, 32:64], model.h[1].attn.k_proj.weight.numpy())
    wte = raw[:offsets["wpe"]].reshape(shapes["wte"])
    assert np.array_equal(wte[130:], model.wte.pad.numpy()) and wte.shape[0] == 256


def test_llmc_bad_files(tmp_path):
    config = GPT2Config(vocab_size=300, dim=64, n_layers=2, n_heads=4, max_seq=32)
    path = llmc.save(tmp_path / "m.bin", _model(config))
    data = bytearray(path.read_bytes())
    bad = tmp_path / "bad.bin"
    bad.write_bytes(data[:-4])
    with pytest.raises(state.CheckpointError, match="implies"):
        llmc.read(bad)
    bad.write_bytes(b"\x00" * 1024)
    with pytest.raises(state.CheckpointError, match="magic"):
        llmc.read(bad)
    hdr = np.frombuffer(bytes(data[:1024]), dtype="<i4").copy()
    hdr[1] = 4
    bad.write_bytes(hdr.tobytes() + bytes(data[1024:]))
    with pytest.raises(state.CheckpointError, match="version 4"):
        llmc.read(bad)
    hdr[1], hdr[5] = 3, 5  # 5 heads do not divide 64 channels
    bad.write_bytes(hdr.tobytes() + bytes(data[1024:]))
    with pytest.raises(state.CheckpointError, match="no GPT-2"):
        llmc.read(bad)
    with pytest.raises(state.CheckpointError, match="cannot read"):
        llmc.read(tmp_path / "missing.bin")
    with pytest.raises(ValueError, match="f32 or bf16"):
        llmc.save(tmp_path / "x.bin", _model(config), dtype="f16")


def _losses(out):
    from modelhelp import run_log
    return [(r["step"], r["loss"]) for r in run_log(out) if "loss" in r]


def test_train_resume_sample_and_export_through_the_trainer(tmp_path, monkeypatch):
    """`xtrain train --preset gpt2-124m` as train() runs it (the preset shrunk to 2 layers of 64 so
    the CPU test is quick): the run builds a GPT2, resumes bit-exact (dropout on: the RNG state
    matters), refuses another preset on resume, samples, and its checkpoint exports."""
    from modelhelp import prepared_stories, tiny_run
    from xtrain.models import gpt2
    from xtrain.trainer.train import train

    monkeypatch.setitem(gpt2.PRESETS, "gpt2-124m", dict(dim=64, n_layers=2, n_heads=2, max_seq=64))
    data = prepared_stories(tmp_path)
    kw = dict(preset="gpt2-124m", decay_steps=6, dropout=0.1)
    summary = train(tiny_run(tmp_path / "straight", data, 6, **kw))
    assert summary["steps"] == 6
    meta = json.loads((tmp_path / "straight" / "ckpt" / "state.json").read_text())
    assert meta["config"]["arch"] == "gpt2" and meta["config"]["n_layers"] == 2
    train(tiny_run(tmp_path / "split", data, 3, **kw))
    train(tiny_run(tmp_path / "split", data, 6, resume=str(tmp_path / "split" / "ckpt"), **kw))
    assert _losses(tmp_path / "straight") == _losses(tmp_path / "split")
    for name in ("model.safetensors", "optim.safetensors"):
        assert (tmp_path / "straight" / "ckpt" / name).read_bytes() == \
            (tmp_path / "split" / "ckpt" / name).read_bytes(), name
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        train(tiny_run(tmp_path / "split", data, 7, preset="tiny", resume=str(tmp_path / "split" / "ckpt")))
    assert (tmp_path / "straight" / "sample.txt").read_text()
    out = export(tmp_path / "straight" / "ckpt", tmp_path / "hf", dtype="f32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(hf).__name__ == "GPT2LMHeadModel"


def test_init_from_an_llmc_model_file(tmp_path, monkeypatch):
    """`xtrain train --init-from gpt2_124M.bin`: the run starts from the file's weights, with GPT-2's
    tokenizer (here the prepared data's own stands in for tiktoken's, which needs its cache); without
    that tokenizer the file is refused with the reason."""
    from modelhelp import prepared_stories, tiny_run
    from xtrain.data import open_dataset
    from xtrain.data import tokenizer as tokenizers
    from xtrain.data.errors import DataError
    from xtrain.trainer.train import read_init_from, train

    data = prepared_stories(tmp_path)
    tok = open_dataset(data).tokenizer
    model = _model(GPT2Config(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=2, max_seq=64))
    path = llmc.save(tmp_path / "gpt2_tiny.bin", model)
    monkeypatch.setattr(tokenizers, "gpt2_tokenizer", lambda: tok)
    init = read_init_from(str(path))
    assert init.config == model.config and init.tokenizer is tok
    summary = train(tiny_run(tmp_path / "run", data, 1, preset=None, init_from=str(path), lr=1e-9, warmup=0))
    assert summary["steps"] == 1
    back = state.load(tmp_path / "run" / "ckpt").build_model()
    for (n, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, err_msg=n)  # one step at lr 1e-9

    def unavailable():
        raise DataError("tokenizer 'gpt2' is unavailable: not in tiktoken's cache")

    monkeypatch.setattr(tokenizers, "gpt2_tokenizer", unavailable)
    with pytest.raises(hf_import.PretrainedError, match="GPT-2's tokenizer"):
        read_init_from(str(path))
