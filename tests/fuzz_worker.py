"""The fuzz worker: a separate Python process that runs the cases tests/fuzzhelp.py sends it and
answers how each one ended. A native crash (a segfault, an abort) ends this process, and the
parent reports the case that did it, instead of pytest itself dying.

Protocol: one JSON object per line on stdin (a case), one JSON object per line back on the file
descriptor given as argv[1] (the outcome). Anything the cases print goes to the worker's own
stdout/stderr (the parent discards them), so it never mixes with the answers.

Case kinds:
    {"kind": "call", "fn": "ops.add", "args": [spec...], "kwargs": {name: spec}}
        build the arguments from their specs (see build()), call, and when the result is a
        Tensor, read it back (numpy) and backpropagate through it if it can.
    {"kind": "cli", "argv": [...], "cwd": dir}
        xtrain.trainer.cli.main(argv) in `cwd`, with stdout/stderr captured.
    {"kind": "checkpoint", "path": dir, "export_to": dir}
        open a checkpoint the way sample/train/export do: load, build the model, load the
        optimizer, restore the generators, load the tokenizer, export.
    {"kind": "pretrained", "path": dir}
        read a Hugging Face directory the way --init-from does (hf_import.read_pretrained).
    {"kind": "generate", "args": [spec...], "kwargs": {name: spec}}
        generate() on a small model (GENERATE_CONFIG) with those arguments after the model.
Outcomes: {"ok": true, ...} or {"ok": false, "type": name, "bases": [names], "message": str};
a cli case answers {"code": int, "stderr": str}.

Limits: the allocator may reserve at most MEMORY_LIMIT on the CPU and the process's address
space is capped, so a case that asks for absurd sizes fails with an error instead of swapping.
"""

import contextlib
import io
import json
import math
import os
import resource
import sys

MEMORY_LIMIT = 1 << 30
ADDRESS_SPACE = 12 << 30
GENERATE_CONFIG = dict(vocab_size=64, dim=32, n_layers=1, n_heads=2, head_dim=16, ffn_dim=48, max_seq=24)
_models = {}


def build(spec):
    """A JSON argument spec -> the Python value.
    {"tensor": {"shape", "dtype", "fill", "grad"}} | {"float": "nan"|"inf"|"-inf"|x} |
    {"int": "digits"} (any size) | {"list": [spec...]} | {"tuple": [spec...]} | {"rng": seed} (a numpy
    Generator) | a JSON literal."""
    import numpy as np
    import xtrain

    if isinstance(spec, dict) and "tensor" in spec:
        t = spec["tensor"]
        shape, dtype, fill = tuple(t["shape"]), t["dtype"], t["fill"]
        n = math.prod(shape)
        if fill == "ids":
            arr = np.arange(n, dtype=np.int64).reshape(shape) % 7
        elif fill in ("nan", "inf", "-inf"):
            arr = np.full(shape, float(fill))
        elif fill == "huge":
            arr = np.full(shape, 3e38)
        else:
            arr = np.random.default_rng(n).standard_normal(shape)
        out = xtrain.tensor(arr, dtype=dtype)
        if t.get("grad"):
            out.requires_grad = True
        return out
    if isinstance(spec, dict) and "float" in spec:
        return float(spec["float"])
    if isinstance(spec, dict) and "int" in spec:
        return int(spec["int"])
    if isinstance(spec, dict) and "rng" in spec:
        return np.random.default_rng(spec["rng"])
    if isinstance(spec, dict) and "list" in spec:
        return [build(s) for s in spec["list"]]
    if isinstance(spec, dict) and "tuple" in spec:
        return tuple(build(s) for s in spec["tuple"])
    return spec


def resolve(name):
    import xtrain

    obj = xtrain
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def run_call(case):
    import xtrain

    fn = case["fn"]
    args = [build(s) for s in case.get("args", [])]
    kwargs = {k: build(s) for k, s in case.get("kwargs", {}).items()}
    if fn.startswith("Tensor."):  # a method: the first argument is the tensor
        result = getattr(args[0], fn.split(".", 1)[1])(*args[1:], **kwargs)
    else:
        result = resolve(fn)(*args, **kwargs)
    results = result if isinstance(result, (tuple, list)) else [result]
    for r in results:
        if isinstance(r, xtrain.Tensor):
            r.numpy()
            repr(r)
            if r.requires_grad and r.dtype in ("float32", "float64", "bfloat16"):
                xtrain.ops.sum(r).backward()
    return {"ok": True}


def run_cli(case):
    from xtrain.trainer import cli

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(case["cwd"])
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(case["argv"])
            except SystemExit as e:  # argparse: --help, bad flags
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        os.chdir(cwd)
    return {"ok": True, "code": code, "stderr": err.getvalue()[-4000:]}


def run_checkpoint(case):
    from xtrain.io import state
    from xtrain.io.export import export
    from xtrain.optim import AdamW

    ckpt = state.load(case["path"])
    model = ckpt.build_model("cpu")
    opt = AdamW(model.named_parameters())
    if ckpt.meta.get("optimizer") is not None:
        ckpt.load_optimizer(opt)
    ckpt.restore_rng()
    if ckpt.meta.get("tokenizer") is not None:
        ckpt.tokenizer()
    export(case["path"], case["export_to"], dtype="f32")
    return {"ok": True}


def run_pretrained(case):
    from xtrain.models import TransformerConfig, hf_import

    hf_import.read_pretrained(case["path"], TransformerConfig)
    return {"ok": True}


def run_generate(case):
    from xtrain.models import TinyTransformer, TransformerConfig

    if "model" not in _models:
        _models["model"] = TinyTransformer(TransformerConfig(**GENERATE_CONFIG))
    args = [build(s) for s in case.get("args", [])]
    kwargs = {k: build(s) for k, s in case.get("kwargs", {}).items()}
    _models["model"].generate(*args, **kwargs)
    return {"ok": True}


RUNNERS = {"call": run_call, "cli": run_cli, "checkpoint": run_checkpoint, "pretrained": run_pretrained,
           "generate": run_generate}


def main():
    answers = os.fdopen(int(sys.argv[1]), "w")
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    import xtrain

    for line in sys.stdin:
        case = json.loads(line)
        xtrain.set_memory_limit(MEMORY_LIMIT, "cpu")
        try:
            outcome = RUNNERS[case["kind"]](case)
        except BaseException as e:  # noqa: BLE001 -- the parent judges every outcome
            outcome = {"ok": False, "type": type(e).__name__,
                       "bases": [c.__name__ for c in type(e).__mro__], "message": str(e)[:2000]}
        answers.write(json.dumps(outcome) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
