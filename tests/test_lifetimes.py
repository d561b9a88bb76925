"""What a training run makes on a rank thread dies there, by reference counting, not later in a
reference cycle that the garbage collector frees on whichever thread it happens to run: on a GPU
the objects of a run (its CUDA graphs, the tensors bound to the rank thread's stream, the
communicator's handle) are tied to that thread, and a collection on another rank's thread, after
the first thread and its streams are gone, crashed the process (a segmentation fault in the
collector, on the thread of the next data-parallel run). Each test runs with the collector off,
so an object caught in a cycle stays alive and fails it; the CPU stands in for the GPU (a
stand-in graph where a capture is needed)."""

import gc
import threading
import weakref

import numpy as np
import pytest

import xtrain
from cpu_collectives import ThreadCollectives
from modelhelp import make_model, prepared_stories, small_config
from test_graphs import _RunAtOnce
from test_process_training import CpuLaunch
from xtrain import graphs
from xtrain.launch import distributed
from xtrain.models import generate
from xtrain.optim import AdamW
from xtrain.trainer import train as train_mod
from xtrain.trainer.train import TrainConfig, open_inputs


class _StandInGraph(_RunAtOnce):
    """test_graphs' stand-in for xtrain.cuda.Graph on the CPU (the 'captured' work runs as it is
    queued, a replay does nothing, capture number `fail_at` raises), with a weak reference to
    every graph made (`refs`)."""
    refs: list = []

    def __init__(self, device=0, share_pool_with=None):
        super().__init__(device, share_pool_with)
        type(self).refs.append(weakref.ref(self))


@pytest.fixture
def no_gc():
    """The garbage collector off for the test: what a cycle holds stays alive."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture
def stand_in_graphs(monkeypatch):
    monkeypatch.setattr(xtrain.cuda, "Graph", _StandInGraph)
    monkeypatch.setattr(_StandInGraph, "made", 0)
    monkeypatch.setattr(_StandInGraph, "refs", [])
    monkeypatch.setattr(_StandInGraph, "fail_at", None)
    return _StandInGraph


class _Owner:
    """Holds a StepGraphs whose note refers back to it, as the training loop's run does."""


def _closed_graphs_owner():
    """(weak references to) an owner holding a closed StepGraphs whose note refers to the owner
    (as train.setup's lambda does), and its model, once every other reference is gone."""
    model = make_model(small_config(), weights_seed=1)
    owner = _Owner()
    owner.graphs = graphs.StepGraphs(model, AdamW(model.named_parameters()), 1, 1.0, blocked="switched off",
                                     note=lambda msg: print(owner, msg))
    owner.graphs.close()
    return weakref.ref(owner), weakref.ref(model)


def test_closed_step_graphs_release_their_owner(no_gc):
    owner, model = _closed_graphs_owner()
    assert owner() is None, "the note's reference to the owner kept the owner in a cycle"
    assert model() is None, "the closed StepGraphs still holds the model"


def test_failed_update_capture_leaves_no_cycle(no_gc, stand_in_graphs):
    """The update graph's capture fails: the step finishes eagerly and both graphs go when the step
    returns (the exception, whose traceback holds the capturing frame, is not kept there)."""
    stand_in_graphs.fail_at = 2
    model = make_model(small_config(), weights_seed=1)
    sg = graphs.StepGraphs(model, AdamW(model.named_parameters(), lr=1e-2), 1, 1.0, note=lambda m: None, warmup=0)
    ids = np.zeros((2, 16), np.int64)
    assert sg.step(ids, ids) is not None and sg.disabled.startswith("capture of the clip + AdamW failed")
    assert len(stand_in_graphs.refs) == 2
    assert [g() for g in stand_in_graphs.refs] == [None, None], "a failed capture's graphs outlived the step"


RUN = dict(preset="tiny", seq=32, batch=2, lr=3e-3, warmup=1, decay_steps=4, eval_every=0, save_every=0,
           sample_tokens=4, progress=False, seed=0, steps=2)


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_rank_runs_leave_nothing_to_a_later_collection(tmp_path, monkeypatch, no_gc, stand_in_graphs, optimizer):
    """Two CPU rank threads train (Muon's or AdamW's data-parallel step) and rank 0 samples at the
    end with its decode step 'captured' and kept on the model, as on a GPU. The decode graph goes
    on rank 0's thread, before the thread (on a GPU: with its stream) ends; the model, which the
    frames matplotlib's parser leaves in reference cycles hold through the run, is gone once
    launch() returns (collected by the launcher, on its own thread)."""
    monkeypatch.setattr(generate, "decode_graph_blocker", lambda model, cuda_graphs: None)
    models, freed = [], {}
    sample_text = train_mod.sample_text

    def on_free(obj, what):
        weakref.finalize(obj, lambda: freed.setdefault(what, threading.current_thread().name))

    def spy(model, *args, **kw):
        out = sample_text(model, *args, **kw)
        kept = model.__dict__.get("_kept_decode")
        assert kept is not None and isinstance(kept.runner.graph, _StandInGraph)  # kept, as a GPU run keeps it
        on_free(kept.runner.graph, "decode graph")
        on_free(model, "model")
        models.append(weakref.ref(model))
        return out

    monkeypatch.setattr(train_mod, "sample_text", spy)
    cfg = TrainConfig(**RUN, optimizer=optimizer, data=str(prepared_stories(tmp_path)), out=str(tmp_path / "out"))
    dataset, start = open_inputs(cfg, False)
    xtrain.manual_seed(cfg.seed)
    launch = CpuLaunch(ThreadCollectives(2), [0, 1], 30.0)
    summary = launch.run(lambda ctx: train_mod.train(cfg, ctx=ctx, prepared=(dataset, start)))[0]
    assert summary["steps"] == 2 and len(models) == 1  # rank 0 samples
    assert freed.get("decode graph") == "xtrain-rank0", freed
    assert models[0]() is None, "rank 0's model outlived launch() in a reference cycle"
    assert freed["model"] in ("xtrain-rank0", threading.current_thread().name), freed


@pytest.mark.skipif(not distributed.is_available(), reason="needs an NCCL build of xtrain and a GPU")
def test_collection_on_a_later_rank_thread_finds_nothing_of_earlier_runs(tmp_path, monkeypatch):
    """On one GPU: three data-parallel runs (Muon), each sampling with a captured decode step kept
    on the model, and in each a garbage collection on the rank's thread where the loss curve is
    plotted, as in the segmentation fault this guards (the rank thread of a later run has the
    earlier one's thread id). Nothing of an earlier run is left for it: neither its model nor
    its decode graph."""
    from modelhelp import tiny_run

    earlier, alive = [], []
    plot_losses, sample_text = train_mod.plot_losses, train_mod.sample_text

    def collect_then_plot(history, path):
        alive.append([what for what, ref in earlier if ref() is not None])
        gc.collect()
        plot_losses(history, path)

    def sample_and_note(model, *args, **kw):
        out = sample_text(model, *args, **kw)
        earlier.extend([("model", weakref.ref(model)),
                        ("decode graph", weakref.ref(model.__dict__["_kept_decode"].runner.graph))])
        return out

    monkeypatch.setattr(train_mod, "plot_losses", collect_then_plot)
    monkeypatch.setattr(train_mod, "sample_text", sample_and_note)
    data = prepared_stories(tmp_path)
    for name, on in (("eager", False), ("graphs", True), ("again", True)):
        train_mod.train_data_parallel(tiny_run(tmp_path / name, data, 4, "cuda", cuda_graphs=on, optimizer="muon"),
                                      [0])
    assert alive == [[], [], []], alive
    assert all(ref() is None for _, ref in earlier)
