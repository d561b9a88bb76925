"""One process of the CPU tests of Muon with data parallelism as real processes
(tests/test_muon_distributed.py): xtrain.launch.distributed.run_process with collectives through
files (tests/cpu_collectives.FileCollectives), a small model under DataParallelMuon. argv[1] is the
scenario, JSON:

    {"collectives": DIR,      # the files of the collectives (one directory per group)
     "first": 0,              # the seed of the first step's batch (steps take first, first + 1, ...)
     "steps": 3,              # steps to run
     "load": CKPT or null,    # start from this checkpoint's weights and optimizer state
     "save": CKPT or null}    # rank 0 saves the run here at the end (after gather_state)

Every rank trains on the same batches (the average of equal gradients is that gradient), so the
result is one device's. Prints `RESULT <json>`: the matrices this rank owns, its momentum buffer's
elements, the elements of AdamW's part whose moments it keeps, the allocator's live bytes that
building the optimizer and DataParallelMuon left (the cache emptied first) and a hash of every
weight after the steps."""

import hashlib
import json
import sys

import xtrain
from cpu_collectives import FileCollectives
from modelhelp import batch
from xtrain.io import state as ckpt_state
from xtrain.launch import distributed
from xtrain.launch.distributed import DataParallelMuon
from xtrain.optim import Muon, block_matrices


def model_config():
    """The model of these tests: big enough that the allocator's rounding is small against a rank's share."""
    from modelhelp import small_config
    return small_config(vocab_size=512, dim=128, head_dim=32, n_heads=4, ffn_dim=256, n_layers=2)


def allocated() -> int:
    """Live bytes on the CPU, with the cache emptied first (test_muon_state's measure)."""
    xtrain.empty_cache("cpu")
    return xtrain.memory_stats("cpu")["allocated_bytes.current"]


def build(load):
    """The model (fixed random weights, or a checkpoint's) and its Muon over the blocks' matrices."""
    from modelhelp import make_model
    if load is None:
        model = make_model(model_config(), weights_seed=6)
    else:
        model = ckpt_state.load(load).build_model("cpu")
    return model, lambda: Muon(model.named_parameters(), matrices=block_matrices(model.named_parameters()), lr=1e-2)


def run_steps(model, opt, first, steps, dp=None):
    """`steps` clipped, guarded steps on batches first, first + 1, ... (one device without dp)."""
    for step in range(first, first + steps):
        ids, targets = batch(model.config, B=2, S=16, seed=step)
        _, loss = model(ids, targets)
        loss.backward()
        if dp is None:
            opt.clip_and_step(1.0, loss.detach())
            opt.zero_grad()
        else:
            dp.step(1.0, extra=[loss.detach()], guard=loss.detach())


def weight_hashes(model) -> dict:
    return {n: hashlib.sha256(p.numpy().tobytes()).hexdigest() for n, p in model.named_parameters()}


def rank_run(ctx, scenario):
    model, make_opt = build(scenario.get("load"))
    model.store.use_flat_grads()  # as DataParallelMuon does: the store's buffer, not the optimizer's state
    base = allocated()
    opt = make_opt()
    dp = DataParallelMuon(opt, ctx)
    state_bytes = allocated() - base
    if scenario.get("load") is not None:
        ckpt_state.load(scenario["load"]).load_optimizer(opt)
    run_steps(model, opt, scenario["first"], scenario["steps"], dp)
    dp.gather_state(root=0)
    if scenario.get("save") is not None and ctx.is_main:
        ckpt_state.save(scenario["save"], model, opt, opt.step_count)
    flat = opt.flat_momentum
    return {"owned": [opt.names[i] for i in opt.owned], "momentum_elements": 0 if flat is None else flat.numel(),
            "adamw_elements": sum(hi - lo for lo, hi, _ in opt.adamw.moment_chunks),
            "adamw_chunks": [[lo, hi] for lo, hi, _ in opt.adamw.moment_chunks],
            "state_bytes": state_bytes, "weights": weight_hashes(model)}


def main() -> int:
    scenario = json.loads(sys.argv[1])
    result = distributed.run_process(lambda ctx: rank_run(ctx, scenario), device="cpu",
                                     communicator=FileCollectives.factory(scenario["collectives"]),
                                     unique_id=lambda: b"muon-worker")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
