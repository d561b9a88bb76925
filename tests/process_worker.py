"""One process of the CPU process-group tests (tests/test_process_group.py):
xtrain.launch.distributed.run_process with stand-in communicator and unique id (this build has no NCCL).
The launcher's variables come from the environment; argv[1] is the scenario, JSON:

    {"exchanges": 2,                                      # exchange() calls before the failure point
     "fail": {"rank": 1, "how": "raise" | "exit" | "stop", "after": 0.3},   # optional
     "key": {"rank": 1, "name": "other"},                 # optional: this rank exchanges another key
     "out": DIR}                                          # optional: the result also in DIR/RANK.json
    {"train": {TrainConfig fields}, "collectives": DIR}   # xtrain.trainer.train.train_processes on the CPU,
                                                          # collectives through files in DIR
    {"gpu": {"steps": 20, "flags": {...}, "step": "shard"}, "fail": {"rank": 1, "at": 3}}
        # two GPUs, real NCCL: test_distributed's training run (its CONFIG and batches), or with
        # "fail" a run in which that rank raises before its reduce-scatter at step "at"

The ranks that do not fail wait "in a collective" (the stand-in blocks until its abort) or poll
ctx.check(), as a training step does. Prints `RESULT <json>` when fn returns; errors print one
line and exit as the CLI does: the failing rank with 1, the ranks it stopped with EXIT_STOPPED.
"""

import json
import os
import signal
import sys
import threading
import time

from xtrain.launch import distributed
from xtrain.launch.rendezvous import EXIT_STOPPED, RankStopped


class StandInComm:
    """The communicator's failure surface: wait() blocks like a rank inside NCCL until abort()."""

    def __init__(self, device, env, unique_id, timeout):
        self.unique_id, self.reason = unique_id, None
        self._aborted = threading.Event()

    @property
    def aborted(self):
        return self._aborted.is_set()

    def wait_ready(self):
        pass

    def rank(self, r):
        return self

    def abort(self, reason):
        if self.reason is None:
            self.reason = reason
        self._aborted.set()

    def close(self):
        pass

    def wait(self, seconds=60.0):
        if self._aborted.wait(seconds):
            raise RuntimeError(f"all_reduce: the communicator was aborted: {self.reason}")


def gpu_run(ctx, scenario):
    """This rank of test_distributed's training run on its GPU: losses, a hash of every weight, and
    the peak allocated memory."""
    import hashlib

    import xtrain
    import test_distributed as td
    from xtrain.launch.distributed import DataParallelAdamW
    from xtrain.models import TinyTransformer, TransformerConfig
    from xtrain.optim import AdamW

    g = scenario["gpu"]
    config = TransformerConfig(**getattr(td, g.get("config", "CONFIG")), **g.get("flags", {}))
    batches = td._global_batches(config.vocab_size, steps=g.get("steps", td.STEPS))
    fail = scenario.get("fail")
    xtrain.reset_peak_memory_stats(ctx.device)
    if fail is None:
        losses, params, _ = td._train(config, batches, ctx.device, ctx, step=g.get("step", "shard"))
    else:
        model = TinyTransformer(config, device=ctx.device, seed=0)
        dp = DataParallelAdamW(AdamW(model.named_parameters(), lr=td.LR), ctx)
        losses = []
        for step, (x, y) in enumerate(batches):
            ctx.check()
            _, loss = model(x[ctx.rank * td.B:(ctx.rank + 1) * td.B], y[ctx.rank * td.B:(ctx.rank + 1) * td.B])
            loss.backward()
            if ctx.rank == fail["rank"] and step == fail["at"]:
                raise ArithmeticError(f"rank {ctx.rank} failed at step {step}")  # the others wait in NCCL
            dp.step(1.0, extra=[loss.detach()])
            losses.append(loss.detach().item())
        params = {n: p.numpy() for n, p in model.named_parameters()}
    return {"losses": [float(v) for v in losses],
            "params": {n: hashlib.sha256(a.tobytes()).hexdigest() for n, a in params.items()},
            "peak": xtrain.memory_stats(ctx.device)["allocated_bytes.peak"]}


def main() -> int:
    scenario = json.loads(sys.argv[1])
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))

    def fn(ctx):
        key = scenario.get("key", {})
        name = key["name"] if key.get("rank") == ctx.rank else "value"
        values = [ctx.exchange(name, {"rank": ctx.rank, "id": ctx.comm.unique_id.decode()})
                  for _ in range(scenario.get("exchanges", 1))]
        fail = scenario.get("fail")
        if fail is None:
            return {"values": values, "hosts": ctx.devices, "main": ctx.is_main}
        if ctx.rank == fail["rank"]:
            time.sleep(fail.get("after", 0.0))
            if fail["how"] == "raise":
                raise ValueError(f"rank {ctx.rank} broke on purpose")
            if fail["how"] == "exit":
                os._exit(7)  # dies without a word, as a killed process
            os.kill(os.getpid(), signal.SIGSTOP)  # hangs, heartbeat thread included
        if ctx.rank % 2:
            ctx.comm.wait()  # "blocked in NCCL" until the abort
        while True:
            ctx.check()  # between steps
            time.sleep(0.02)

    try:
        if "train" in scenario:
            from cpu_collectives import FileCollectives
            from xtrain.launch import env as launch_env
            from xtrain.trainer.train import TrainConfig, train_processes

            from xtrain.io.rundir import claim_run

            cfg = TrainConfig(**scenario["train"])
            summary = train_processes(cfg, launch_env.detect(), claim=lambda: claim_run(cfg.out, cfg.resume),
                                      device="cpu", communicator=FileCollectives.factory(scenario["collectives"]))
            result = None if summary is None else {k: summary[k] for k in ("steps", "final_loss", "devices")}
        elif "gpu" in scenario:
            result = distributed.run_process(lambda ctx: gpu_run(ctx, scenario),
                                             rendezvous_method=scenario.get("rendezvous"))
        else:
            result = distributed.run_process(fn, rendezvous_method=scenario.get("rendezvous"), device="cpu",
                                             communicator=StandInComm, unique_id=lambda: b"id-from-rank-0")
    except RankStopped as e:
        print(f"xtrain: rank {rank}: stopped: {str(e).split(' stopped because ', 1)[-1]}", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    except Exception as e:  # noqa: BLE001 - the CLI's one line
        print(f"xtrain: rank {rank}: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    print("RESULT " + json.dumps(result), flush=True)
    if "out" in scenario:  # where the ranks' stdout is merged (mpirun), lines may interleave
        with open(os.path.join(scenario["out"], f"{rank}.json"), "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
