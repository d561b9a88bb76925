"""Muon's state layout (known issue 35's fix): AdamW(only=...) keeps moments for the parameters it
updates only, so Muon allocates no second moment for its matrices (measured with the CPU
allocator's stats); the matrices' momentum is its own buffer, saved as "momentum_buffer.<name>";
a checkpoint in the layout Muon wrote before (AdamW's over every parameter, the momentum as a
matrix's exp_avg, a zero exp_avg_sq) still resumes bit-exactly, on one device and with
DataParallelMuon's rank threads; the checkpoint schema accepts those two layouts only."""

import json

import numpy as np
import pytest
import safetensors.numpy

import xtrain
from modelhelp import batch, make_model, prepared_stories, run_log, small_config, tiny_run
from xtrain.data.layout import file_sha256
from xtrain.io import state as ckpt_state
from xtrain.models import GPT2, preset_config
from xtrain.optim import AdamW, Muon, block_matrices
from xtrain.trainer.train import train

OPTIM = "optim.safetensors"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("muon-state-data"))


def _block_matrices(model):
    return [n for n, p in model.named_parameters() if n.startswith("layers.") and len(p.shape) == 2]


def _allocated(device: str) -> int:
    """Live bytes, with the cache emptied first: a request served from a cached block counts that
    block's size (up to twice its own), so what comes next is measured on fresh blocks."""
    xtrain.empty_cache(device)
    return xtrain.memory_stats(device)["allocated_bytes.current"]


# ---------------------------------------------------------------- memory

def test_muon_allocates_no_second_moment_for_its_matrices(device):
    """AdamW over everything: two float32 moments per element of the store. Muon: one momentum per
    matrix element, two moments per other element (each block of its buffers aligned to 64
    elements): the drop is the matrices' second moment (before the fix: no drop at all)."""
    model = make_model(small_config(vocab_size=512, dim=128, head_dim=32, n_heads=4, ffn_dim=256, n_layers=2),
                       device=device)
    mats = _block_matrices(model)
    named = dict(model.named_parameters())
    matrix_elems = sum(named[n].numel() for n in mats)
    base = _allocated(device)
    adamw = AdamW(model.named_parameters())
    adamw_bytes = _allocated(device) - base
    del adamw
    base = _allocated(device)
    muon = Muon(model.named_parameters(), matrices=mats)
    muon_bytes = _allocated(device) - base
    # the layout: one aligned block per matrix; AdamW's blocks cover the other parameters only
    aligned = lambda n: -(-n // 64) * 64  # noqa: E731
    assert muon.flat_momentum.numel() == sum(aligned(named[n].numel()) for n in mats)
    other_elems = sum(p.numel() for n, p in named.items() if n not in mats)
    assert other_elems <= muon.adamw.flat_v.numel() <= other_elems + 64 * len(named)
    # the allocator's stats (sizes rounded up to one of 8 classes per octave: at most 1/8 more)
    assert adamw_bytes >= 2 * 4 * model.store.numel
    assert muon_bytes <= 9 / 8 * 4 * (muon.flat_momentum.numel() + 2 * muon.adamw.flat_v.numel()) + 3 * 512
    assert adamw_bytes - muon_bytes >= 4 * matrix_elems, (adamw_bytes, muon_bytes, matrix_elems)
    assert muon.adamw.exp_avg_sq[muon.matrices[0]] is None


def test_block_matrices_are_the_blocks_2d_weights():
    model = make_model(small_config())
    assert block_matrices(model.named_parameters()) == _block_matrices(model)
    gpt2 = GPT2(preset_config("gpt2-124m", 96, n_layers=2, dim=32, n_heads=2, max_seq=16))
    names = block_matrices(gpt2.named_parameters())
    assert names == [f"h.{i}.{n}.weight" for i in range(2) for n in
                     ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    Muon(gpt2.named_parameters(), matrices=names)  # the rest (wte, wpe, norms, biases) AdamW's


# ---------------------------------------------------------------- AdamW(only=...)

def test_adamw_only_updates_its_parameters_as_the_full_adamw_does():
    """The same gradients: AdamW(only=names) moves exactly those parameters, bit for bit as an
    AdamW over every parameter moves them, and keeps their moments only; the rest stay put."""
    cfg = small_config()
    full_model, part_model = make_model(cfg, weights_seed=7), make_model(cfg, weights_seed=7)
    names = [n for n, _ in full_model.named_parameters()]
    only = names[1::2]
    full = AdamW(full_model.named_parameters(), lr=1e-2)
    part = AdamW(part_model.named_parameters(), lr=1e-2, only=only)
    start = {n: p.numpy().copy() for n, p in part_model.named_parameters()}
    for step in range(3):
        ids, targets = batch(cfg, seed=step)
        for model, opt in ((full_model, full), (part_model, part)):
            _, loss = model(ids, targets)
            loss.backward()
            opt.clip_and_step(1.0, loss)
            opt.zero_grad()
        # the two models drift apart where `part` leaves parameters alone: align their weights
        for (n, p), (_, q) in zip(full_model.named_parameters(), part_model.named_parameters()):
            if n not in only:
                with xtrain.no_grad():
                    p.copy_(xtrain.tensor(start[n]))
    got, want = part.moment_arrays(), full.moment_arrays()
    assert list(got[0]) == only and list(got[1]) == only
    for n, p in part_model.named_parameters():
        if n in only:
            np.testing.assert_array_equal(p.numpy(), dict(full_model.named_parameters())[n].numpy(), err_msg=n)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g[n], w[n], err_msg=n)
        else:
            np.testing.assert_array_equal(p.numpy(), start[n], err_msg=n)
    restored = AdamW(make_model(cfg).named_parameters(), lr=1e-2, only=only)
    restored.load_state_dict(part.state_dict())
    for g, w in zip(restored.moment_arrays(), got):
        for n in only:
            np.testing.assert_array_equal(g[n], w[n], err_msg=n)
    with pytest.raises(KeyError, match="missing"):
        restored.load_state_dict(full.state_dict() | {"exp_avg": {n: full.exp_avg[0] for n in only[:1]}})


def test_adamw_only_bad_arguments_are_clear_errors():
    model = make_model(small_config())
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="not among the parameters"):
        AdamW(named, only=["nope"])
    with pytest.raises(ValueError, match="named twice"):
        AdamW(named, only=[named[0][0], named[0][0]])
    with pytest.raises(ValueError, match="shard must be"):
        AdamW(named, only=[named[0][0]], shard=(2, 2))
    assert AdamW(named, only=[named[0][0]], shard=(0, 2)).sharded  # its share of `only` (share_chunks)
    opt = AdamW(named, only=[named[0][0]])
    with pytest.raises(ValueError, match="within the moments kept here"):
        opt.keep_moments([(0, 64)])


# ---------------------------------------------------------------- state and checkpoints

def _legacy_state(opt: Muon) -> dict:
    """The state Muon kept before it had a layout of its own: AdamW's over every parameter, a
    matrix's momentum as its exp_avg and a zero exp_avg_sq."""
    st = opt.state_arrays()
    exp_avg, exp_avg_sq = {}, {}
    for n, p in zip(opt.names, opt.params):
        if n in st["momentum_buffer"]:
            exp_avg[n], exp_avg_sq[n] = st["momentum_buffer"][n], np.zeros(tuple(p.shape), np.float32)
        else:
            exp_avg[n], exp_avg_sq[n] = st["exp_avg"][n], st["exp_avg_sq"][n]
    return {"step": opt.step_count, "hyper": opt.hyper(), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def test_state_names_and_the_legacy_state_load():
    cfg = small_config()
    model = make_model(cfg, weights_seed=5)
    mats = _block_matrices(model)
    opt = Muon(model.named_parameters(), matrices=mats, lr=1e-2)
    for step in range(2):
        ids, targets = batch(cfg, seed=step)
        _, loss = model(ids, targets)
        loss.backward()
        opt.clip_and_step(1.0, loss)
        opt.zero_grad()
    st = opt.state_dict()
    others = [n for n in opt.names if n not in mats]
    assert list(st["momentum_buffer"]) == mats
    assert list(st["exp_avg"]) == others and list(st["exp_avg_sq"]) == others
    for load in (st, _legacy_state(opt)):
        other = Muon(make_model(cfg).named_parameters(), matrices=mats)
        other.load_state_dict(load)
        assert other.step_count == 2
        for kind, arrays in opt.state_arrays().items():
            got = other.state_arrays()[kind]
            for n, a in arrays.items():
                np.testing.assert_array_equal(got[n], a, err_msg=f"{kind}.{n}")
    broken = _legacy_state(opt)
    del broken["exp_avg_sq"][mats[0]]
    with pytest.raises(KeyError, match="AdamW's layout"):
        Muon(make_model(cfg).named_parameters(), matrices=mats).load_state_dict(broken)
    with pytest.raises(KeyError, match="momentum_buffer"):
        Muon(make_model(cfg).named_parameters(), matrices=mats).load_state_dict(
            {**st, "momentum_buffer": dict(list(st["momentum_buffer"].items())[1:])})


def _write_legacy_checkpoint(ckpt) -> None:
    """Rewrite `ckpt`'s optim.safetensors in Muon's earlier layout (AdamW's over every parameter:
    the momentum as a matrix's exp_avg, its exp_avg_sq zero), and its record in state.json."""
    meta = json.loads((ckpt / "state.json").read_text())
    tensors = safetensors.numpy.load_file(str(ckpt / OPTIM))
    legacy = {}
    for n in meta["optimizer"]["names"]:
        if f"momentum_buffer.{n}" in tensors:
            m = tensors[f"momentum_buffer.{n}"]
            legacy[f"exp_avg.{n}"], legacy[f"exp_avg_sq.{n}"] = m, np.zeros_like(m)
        else:
            legacy[f"exp_avg.{n}"], legacy[f"exp_avg_sq.{n}"] = tensors[f"exp_avg.{n}"], tensors[f"exp_avg_sq.{n}"]
    safetensors.numpy.save_file(legacy, str(ckpt / OPTIM))
    meta["files"][OPTIM] = {"bytes": (ckpt / OPTIM).stat().st_size, "sha256": file_sha256(ckpt / OPTIM)}
    (ckpt / "state.json").write_text(json.dumps(meta, sort_keys=True, indent=1))


def _losses(out):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in run_log(out) if "loss" in r]


def test_checkpoint_names_muon_state_and_a_legacy_checkpoint_resumes_bit_exactly(tmp_path, data, device):
    kw = dict(decay_steps=8, optimizer="muon", device=device)
    train(tiny_run(tmp_path / "straight", data, 8, **kw))
    split = tmp_path / "split"
    train(tiny_run(split, data, 4, **kw))
    names = set(safetensors.numpy.load_file(str(split / "ckpt" / OPTIM)))
    model = make_model(ckpt_state.load(split / "ckpt").config)
    mats = _block_matrices(model)
    assert {f"momentum_buffer.{n}" for n in mats} <= names
    assert not any(f"exp_avg_sq.{n}" in names or f"exp_avg.{n}" in names for n in mats)
    assert len(names) == len(mats) + 2 * (len(list(model.named_parameters())) - len(mats))
    _write_legacy_checkpoint(split / "ckpt")
    assert not any(n.startswith("momentum_buffer.") for n in safetensors.numpy.load_file(str(split / "ckpt" / OPTIM)))
    train(tiny_run(split, data, 8, resume=str(split / "ckpt"), **kw))
    assert _losses(split) == _losses(tmp_path / "straight")
    for name in ("model.safetensors", OPTIM):  # written back in the new layout
        assert (split / "ckpt" / name).read_bytes() == (tmp_path / "straight" / "ckpt" / name).read_bytes(), name


def test_legacy_checkpoint_resumes_bit_exactly_with_data_parallel_muon(tmp_path, data):
    from test_muon_distributed import _cfg
    from test_process_training import _log, _same_checkpoint, _threads

    full, part = tmp_path / "full", tmp_path / "part"
    _threads(_cfg(data, full, 4))
    _threads(_cfg(data, part, 2))
    _write_legacy_checkpoint(part / "ckpt")
    _threads(_cfg(data, part, 4, resume=True))
    assert _log(part) == _log(full)
    _same_checkpoint(part, full)


def test_schema_refuses_a_muon_optim_file_of_neither_layout(tmp_path, data):
    train(tiny_run(tmp_path, data, 2, optimizer="muon"))
    ckpt = tmp_path / "ckpt"
    tensors = safetensors.numpy.load_file(str(ckpt / OPTIM))
    dropped = next(n for n in tensors if n.startswith("momentum_buffer."))
    # a new-layout file that also keeps a matrix's exp_avg_sq: neither layout
    extra = {**tensors, f"exp_avg_sq.{dropped.split('.', 1)[1]}": tensors[dropped]}
    meta = json.loads((ckpt / "state.json").read_text())
    for bad, match in ((extra, "tensors; the config implies"),):
        safetensors.numpy.save_file(bad, str(ckpt / OPTIM))
        meta["files"][OPTIM] = {"bytes": (ckpt / OPTIM).stat().st_size, "sha256": file_sha256(ckpt / OPTIM)}
        (ckpt / "state.json").write_text(json.dumps(meta, sort_keys=True))
        with pytest.raises(ckpt_state.CheckpointError, match=match):
            ckpt_state.load(ckpt)
    missing = {k: v for k, v in tensors.items() if k != dropped}
    missing[f"exp_avg.{dropped.split('.', 1)[1]}"] = tensors[dropped]  # the right count, a wrong name
    safetensors.numpy.save_file(missing, str(ckpt / OPTIM))
    meta["files"][OPTIM] = {"bytes": (ckpt / OPTIM).stat().st_size, "sha256": file_sha256(ckpt / OPTIM)}
    (ckpt / "state.json").write_text(json.dumps(meta, sort_keys=True))
    with pytest.raises(ckpt_state.CheckpointError, match="lacks tensor"):
        ckpt_state.load(ckpt)
    safetensors.numpy.save_file(tensors, str(ckpt / OPTIM))
    meta["files"][OPTIM] = {"bytes": (ckpt / OPTIM).stat().st_size, "sha256": file_sha256(ckpt / OPTIM)}
    for matrices in ("all", ["nope"], [1, 2]):
        bad = json.loads(json.dumps(meta))
        bad["optimizer"]["hyper"]["muon"]["matrices"] = matrices
        (ckpt / "state.json").write_text(json.dumps(bad, sort_keys=True))
        with pytest.raises(ckpt_state.CheckpointError, match="muon.matrices"):
            ckpt_state.load(ckpt)
    (ckpt / "state.json").write_text(json.dumps(meta, sort_keys=True))
    assert ckpt_state.load(ckpt).step == 2
