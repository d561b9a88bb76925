"""Export to the Hugging Face Qwen3 layout: loads in transformers with matching logits and greedy
tokens, bf16 rounding matches torch, the tokenizer loads, and the output is byte-identical."""

import json

import numpy as np
import pytest
import torch

from modelhelp import batch, make_model, small_config
from xtrain.io import state
from xtrain.data import generate_stories, train_bpe
from xtrain.io.export import export, hf_name

transformers = pytest.importorskip("transformers")
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A checkpoint of a small model (weights large enough that greedy choices are clear)."""
    root = tmp_path_factory.mktemp("export")
    tok = train_bpe(generate_stories(200), 320)
    model = make_model(small_config(vocab_size=tok.vocab_size, max_seq=64), "cpu", weights_seed=3)
    state.save(root / "ckpt", model, None, 0, tokenizer=tok)
    return root, model, tok


def test_loads_in_transformers_with_matching_logits_and_greedy_tokens(run):
    root, model, tok = run
    out = export(root / "ckpt", root / "hf-f32", dtype="f32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["num_key_value_heads"] == config["num_attention_heads"] == model.config.n_heads
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    hf.eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"

    ids, _ = batch(model.config, B=2, S=12, seed=4)
    ours, _ = model(ids)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits.reshape(-1, model.config.vocab_size)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-4)

    prompt = tok.encode(PROMPT)
    greedy = model.generate([prompt], 20, greedy=True)[0, len(prompt):]
    hf.generation_config.eos_token_id = None  # never stop early: compare all 20 tokens
    with torch.no_grad():
        hf_out = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                             pad_token_id=tok.eot_id)[0, len(prompt):]
    assert greedy.tolist() == hf_out.tolist()


def test_tokenizer_loads_in_transformers(run):
    root, _, tok = run
    out = export(root / "ckpt", root / "hf-tok", dtype="bf16")
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "Lily found a red ball. She was happy!"
    assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf_tok.decode(tok.encode(text)) == text
    assert hf_tok.eos_token_id == tok.eot_id


def test_bf16_export_rounds_like_torch(run):
    root, model, _ = run
    out = export(root / "ckpt", root / "hf-bf16", dtype="bf16")
    from safetensors.torch import load_file

    tensors = load_file(str(out / "model.safetensors"))
    assert set(tensors) == {hf_name(n) for n, _ in model.named_parameters()}
    assert "model.embed_tokens.weight" in tensors and "lm_head.weight" in tensors
    assert "model.layers.1.self_attn.q_norm.weight" in tensors
    for name, p in model.named_parameters():
        want = torch.from_numpy(p.numpy().copy()).to(torch.bfloat16)
        got = tensors[hf_name(name)]
        assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16)), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert hf.dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_export_is_byte_identical(run):
    root, _, _ = run
    a = export(root / "ckpt", root / "same-a", dtype="bf16")
    b = export(root / "ckpt", root / "same-b", dtype="bf16")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    export(root / "ckpt", a, dtype="bf16", overwrite=True)  # again into the same directory
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_export_errors(run, tmp_path):
    root, model, _ = run
    with pytest.raises(ValueError, match="dtype"):
        export(root / "ckpt", tmp_path / "x", dtype="f16")
    state.save(tmp_path / "notok", model, None, 0)
    with pytest.raises(state.CheckpointError, match="no tokenizer"):
        export(tmp_path / "notok", tmp_path / "y")
    with pytest.raises(state.CheckpointError, match="no checkpoint"):
        export(tmp_path / "missing", tmp_path / "z")
