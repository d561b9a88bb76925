"""Property-based fuzzing (hypothesis) of what a user can type: op and tensor-creation arguments,
`xtrain` command lines, and edited checkpoints (state.json mutations, swapped files).

The property: a case either succeeds or fails with an expected exception type carrying a message
(the CLI: one `xtrain: error:` line, exit 2), never a native crash (cases run in a worker
process, tests/fuzzhelp.py), never a raw traceback or an internal error from the CLI, and never
a changed file outside the directory the command was told to write. Every test runs a fixed,
derandomized number of examples so the suite takes a couple of minutes on two cores;
XTRAIN_FUZZ_SCALE=10 XTRAIN_FUZZ_RANDOM=1 runs a longer, exploring session.
"""

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzhelp import Worker, check_cli_outcome, check_raised_cleanly, fuzz_settings, snapshot
from modelhelp import prepared_stories, run_cli
from tokhelp import documents, hf_tokenizer, spm_model, token_stream, write_llmc_shard, write_nanogpt

DTYPES = ["float32", "bfloat16", "float64", "int32", "int64"]
ODD_DTYPES = DTYPES + ["float16", "uint8", "", "cuda", 3, None]
METHODS = ["backward", "backward_seeded", "bfloat16", "clone", "copy_", "detach", "dim", "double",
           "exp", "fill_", "float", "item", "log", "log_softmax", "mean", "numel", "numpy",
           "permute", "reshape", "same_storage", "silu", "size", "softmax", "sqrt", "sum", "to",
           "transpose", "view", "zero_", "__add__", "__mul__", "__truediv__", "__pow__",
           "__matmul__", "__neg__"]
CREATORS = ["tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn"]


# ---------------------------------------------------------------- argument strategies

def tensors(dtypes=DTYPES, fills=("randn", "randn", "randn", "ids", "nan", "inf", "-inf", "huge"), max_dims=4):
    # Sides drawn from a few small values, so two tensors often fit together and the kernels
    # run, and sometimes do not, so the checks run.
    return st.fixed_dictionaries({
        "shape": st.lists(st.sampled_from([1, 2, 3, 3, 4, 0]), max_size=max_dims),
        "dtype": st.sampled_from(dtypes),
        "fill": st.sampled_from(fills),
        "grad": st.booleans(),
    }).map(lambda t: {"tensor": t})


odd_ints = st.sampled_from([0, 1, 2, 3, -1, -2, 7, 2**31, -2**31 - 1, 2**62, 2**63, -2**63 - 1, 10**30])
odd_floats = st.sampled_from(["nan", "inf", "-inf", 0.0, -0.0, 0.5, -1.5, 1e-30, 1e308]).map(
    lambda v: {"float": v})
odd_shapes = st.lists(st.one_of(st.integers(-1, 6), odd_ints), max_size=4).map(lambda xs: {"list": xs})
odd_values = st.one_of(
    tensors(), odd_ints, odd_floats, odd_shapes, st.none(), st.booleans(),
    st.sampled_from(["float32", "int64", "cpu", "cuda:0", "tpu", "", "x" * 300]),
    st.lists(tensors(), max_size=3).map(lambda xs: {"list": xs}))
# What each kind of parameter gets: mostly plausible values, some odd ones.
KINDS = {
    "T": tensors(("float32", "float32", "bfloat16", "float64", "int64")),
    "ids": tensors(("int64", "int32", "float32"), fills=("ids", "ids", "ids", "randn", "huge")),
    "scalar": st.one_of(odd_floats, odd_ints, st.sampled_from([0.5, 2.0, -1.0])),
    "dim": st.one_of(st.integers(-4, 4), odd_ints, st.none()),
    "shape": odd_shapes,
    "dtype": st.sampled_from(ODD_DTYPES),
    "device": st.sampled_from(["cpu", "cuda", "cuda:0", "tpu", "", None]),
    "bool": st.one_of(st.booleans(), st.sampled_from([0, 2, None, "yes"])),
    "Tlist": st.lists(tensors(("float32", "bfloat16", "int64")), max_size=3).map(lambda xs: {"list": xs}),
    "Topt": st.one_of(st.none(), tensors(("float32", "int64", "int32"))),
    # RoPE's Llama 3 scaling (factor, low_freq_factor, high_freq_factor, original_max_positions)
    "llama3": st.one_of(st.none(), st.just((32.0, 1.0, 4.0, 8192.0)),
                        st.lists(st.one_of(odd_floats, odd_ints), min_size=3, max_size=5)),
}
# The kinds of each op's parameters, for the ops whose bound signature does not say them
# (indices, shapes, dtypes, devices, ops written in Python); the others are read from it.
EXPLICIT_SIGNATURES = {
    "add": "T T", "sub": "T T", "mul": "T T", "div": "T T", "scale": "T scalar", "cast": "T dtype",
    "cast_many": "Tlist dtype", "to": "T device dtype", "sum": "T dim bool", "mean": "T dim bool",
    "permute": "T shape", "reshape": "T shape", "view": "T shape", "embedding": "T ids",
    "cross_entropy": "T ids scalar", "dropout": "T scalar bool", "linear_cross_entropy": "T T ids scalar bool",
    "flash_attention": "T T T bool scalar bool", "decode_attention": "T T T T scalar",
    "decode_prep_attention": "T T T T T T T Topt Topt scalar scalar scalar Tlist llama3",
    "greedy_next_": "T T T scalar", "head_layout": "dim dim dtype",
    "qk_norm_rope_attention": "T T T T T scalar scalar Topt llama3 bool scalar Topt",
    "rope_attention": "T T T scalar Topt llama3 bool scalar Topt",
}
# A parameter's kind from its annotation in pybind11's signature line.
ANNOTATION_KINDS = {"xtrain._C.Tensor": "T", "xtrain._C.Tensor | None": "Topt", "bool": "bool",
                    "typing.SupportsFloat | typing.SupportsIndex": "scalar",
                    "typing.SupportsInt | typing.SupportsIndex": "dim",
                    "collections.abc.Sequence[xtrain._C.Tensor]": "Tlist",
                    'typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], '
                    '"FixedSize(4)"] | None': "llama3"}


def bound_signature(name):
    """The kinds of xtrain.ops.<name>'s parameters from its pybind11 signature line
    ("name(x: xtrain._C.Tensor, eps: ... = 1e-06) -> ..."); None when a parameter's type is not
    one of ANNOTATION_KINDS or the op is not a bound function."""
    import xtrain

    doc = getattr(getattr(xtrain.ops, name), "__doc__", None) or ""
    head = doc.split("\n", 1)[0]
    if not head.startswith(name + "(") or ") -> " not in head:
        return None
    params = head[len(name) + 1:head.rindex(") -> ")]
    kinds, depth, start = [], 0, 0
    for i, c in enumerate(params + ","):  # split on the commas outside brackets
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        elif c == "," and depth == 0:
            annotation = params[start:i].split(":", 1)[-1].split(" = ", 1)[0].strip()
            if annotation not in ANNOTATION_KINDS:
                return None
            kinds.append(ANNOTATION_KINDS[annotation])
            start = i + 1
    return " ".join(kinds)


def all_signatures():
    import xtrain

    names = [n for n in dir(xtrain.ops) if not n.startswith("_")]
    return {n: EXPLICIT_SIGNATURES.get(n) or bound_signature(n) for n in names}


SIGNATURES = all_signatures()
OPS = sorted(SIGNATURES)


@st.composite
def op_args(draw, signature):
    """Arguments for a signature: each of its kinds, then now and then one replaced by any odd
    value, one dropped, or one too many."""
    args = [draw(KINDS[k]) for k in signature.split()]
    twist = draw(st.sampled_from(["none"] * 6 + ["replace", "drop", "extra"]))
    if twist == "replace" and args:
        args[draw(st.integers(0, len(args) - 1))] = draw(odd_values)
    elif twist == "drop" and args:
        args.pop()
    elif twist == "extra":
        args.append(draw(odd_values))
    return args


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A directory of everything the CLI fuzz may point at: prepared data, a trained checkpoint,
    a finished run, a raw corpus, a parquet file with an integer text column, a secret file."""
    root = tmp_path_factory.mktemp("fuzz")
    data = prepared_stories(root)
    run = root / "run"
    r = run_cli("train", "--preset", "tiny", "--steps", "2", "--data", data, "--out", run,
                "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "2",
                "--no-progress", "--device", "cpu", cwd=root)
    assert r.returncode == 0, r.stderr
    shutil.copytree(run / "ckpt", root / "ckpt")
    (root / "corpus.txt").write_text("Once upon a time.\n\nThe end.\n" * 50)
    (root / "secret.txt").write_text("the secret\n")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": list(range(100))}), root / "ints.parquet")
    except ImportError:
        pass  # pyarrow missing: the CLI fuzz meets a missing file there instead
    (root / "outs").mkdir()
    _foreign_tokenizers(root)
    return root


def _foreign_tokenizers(root: Path) -> None:
    """Tokenizer files (a tokenizer.json, a corrupt one, a SentencePiece model when the package is
    there), the sandbox checkpoint re-saved with each foreign kind, and token directories: a
    nanoGPT one as nanoGPT leaves it, one prepared in place, an llm.c one with a bad magic."""
    from xtrain.io import state
    from xtrain.data import open_tokenizer, prepare
    from xtrain.optim import AdamW

    hf = hf_tokenizer(root, "hf-tok")
    (root / "corrupt.json").write_text(hf.read_text()[:300])
    kinds = {"ckpt-hf": open_tokenizer(hf)}
    try:
        kinds["ckpt-spm"] = open_tokenizer(spm_model(root, "m.model"))
    except pytest.skip.Exception:
        pass  # sentencepiece missing: the other kinds are fuzzed
    ckpt = state.load(root / "ckpt")
    model = ckpt.build_model("cpu")
    opt = AdamW(model.named_parameters())
    ckpt.load_optimizer(opt)
    for name, tok in kinds.items():
        state.save(root / name, model, opt, ckpt.step, loader_state=ckpt.loader_state, tokenizer=tok,
                   dataset=ckpt.meta["dataset"], train_args=ckpt.meta["train_args"])
    tok = kinds["ckpt-hf"]
    ids = token_stream(tok.encode, documents(80), tok.eot_id, eot_first=False)
    write_nanogpt(root / "nano-data", ids, ids[:400])
    prepare(write_nanogpt(root / "nano-hf", ids, ids[:400]), root / "nano-hf", tokenizer=hf, progress=False)
    write_llmc_shard(root / "llmc-bad" / "x_train.bin", ids)
    write_llmc_shard(root / "llmc-bad" / "x_val.bin", ids, magic=1234)


SANDBOX = ("stories-data", "corpus.txt", "ints.parquet", "secret.txt", "ckpt", "run", "hf-tok", "corrupt.json",
           "m.model", "ckpt-hf", "ckpt-spm", "nano-data", "nano-hf", "llmc-bad")
TOKEN_DIRS = ("nano-data", "nano-hf", "llmc-bad")  # `prepare DIR` without --out writes into DIR


# ---------------------------------------------------------------- ops and tensors

def test_every_op_is_fuzzed():
    unknown = sorted(n for n, sig in SIGNATURES.items() if sig is None)
    assert not unknown, f"ops whose parameters' kinds the bound signature does not give: {unknown}; add them to " \
                        "EXPLICIT_SIGNATURES"
    assert set(EXPLICIT_SIGNATURES) <= set(SIGNATURES), "EXPLICIT_SIGNATURES names ops xtrain.ops no longer has"
    # the inference reads the kinds the explicit rows would give
    assert bound_signature("gelu") == "T"
    assert bound_signature("rms_norm") == "T T scalar"
    assert bound_signature("rope") == "T Topt scalar llama3"
    assert bound_signature("rms_norm_linear_rows") == "T Tlist T scalar Topt bool"
    assert bound_signature("sum") is None  # dim: int | None, an explicit row


@fuzz_settings(150)
@given(data=st.data())
def test_ops_never_crash(worker, data):
    op = data.draw(st.sampled_from(OPS), label="op")
    case = {"kind": "call", "fn": f"ops.{op}", "args": data.draw(op_args(SIGNATURES[op]), label="args")}
    check_raised_cleanly(case, worker.run(case))


@fuzz_settings(80)
@given(method=st.sampled_from(METHODS), target=tensors(), args=st.lists(odd_values, max_size=2))
def test_tensor_methods_never_crash(worker, method, target, args):
    case = {"kind": "call", "fn": f"Tensor.{method}", "args": [target, *args]}
    check_raised_cleanly(case, worker.run(case))


data_values = st.one_of(
    st.recursive(st.one_of(odd_ints, odd_floats, st.booleans(), st.sampled_from(["a", None])),
                 lambda inner: st.lists(inner, max_size=3).map(lambda xs: {"list": xs}), max_leaves=8),
    tensors())


@fuzz_settings(80)
@given(fn=st.sampled_from(CREATORS), first=st.one_of(odd_shapes, odd_ints, data_values),
       more=st.lists(st.one_of(odd_ints, odd_floats), max_size=2),
       kwargs=st.fixed_dictionaries({}, optional={
           "dtype": st.sampled_from(ODD_DTYPES),
           "device": st.sampled_from(["cpu", "cuda", "cuda:0", "tpu", None, 0])}))
def test_tensor_creation_never_crashes(worker, fn, first, more, kwargs):
    case = {"kind": "call", "fn": fn, "args": [first, *more], "kwargs": kwargs}
    check_raised_cleanly(case, worker.run(case))


# ---------------------------------------------------------------- the command line

def _paths(root: Path):
    """Values for path flags: good ones, and every kind of wrong one."""
    return {
        "data": ["stories-data", "corpus.txt", "ints.parquet", "missing", "secret.txt/x", "", "nano-data", "nano-hf",
                 "llmc-bad"],
        "out": ["outs/new", "run", "corpus.txt", "outs/new/deeper", "corpus.txt/x", ""],
        "ckpt": ["ckpt", "run/ckpt", "missing", "corpus.txt", "stories-data", "", "ckpt-hf", "ckpt-spm"],
        "export_out": ["outs/hf", "ckpt", "ckpt/inner", "run", "corpus.txt", "outs"],
    }


INTS = ["1", "2", "0", "-1", "abc", "1.5", "", "99999999999999999999999"]
FLOATS = ["0.1", "1e-3", "nan", "inf", "-1", "abc", "1e309", "0"]


def _flag(name, values):
    return st.sampled_from(values).map(lambda v: [name, v])


def _argv(root: Path):
    p = _paths(root)
    train = st.lists(st.one_of(
        _flag("--data", p["data"]), _flag("--out", p["out"]), _flag("--steps", ["1", "2", "0", "-3", "x"]),
        _flag("--batch", INTS), _flag("--seq", INTS), _flag("--lr", FLOATS), _flag("--dropout", FLOATS),
        _flag("--grad-clip", FLOATS), _flag("--warmup", INTS), _flag("--eval-every", ["0", "1", "x"]),
        _flag("--device", ["cpu", "auto", "cuda", "tpu", ""]), _flag("--memory-limit", ["1", "1KB", "64MB", "12XB", ""]),
        _flag("--preset", ["tiny", "huge"]), _flag("--resume", p["ckpt"]), _flag("--seed", INTS),
        _flag("--min-lr", FLOATS), _flag("--weight-decay", FLOATS), _flag("--decay-steps", INTS),
        st.sampled_from([["--overwrite"], ["--resume"], ["--bf16"], ["--recompute"], ["--bogus"]]),
    ), max_size=5).map(lambda fl: ["train", "--no-progress", "--eval-batches", "1", "--sample-tokens", "2",
                                   "--batch", "2", "--seq", "16", "--steps", "2", "--data", "stories-data",
                                   *[x for f in fl for x in f]])
    tokenizers = ["bpe", "gpt2", "x", "hf-tok", "hf-tok/tokenizer.json", "corrupt.json", "m.model", "secret.txt",
                  "missing.model"]
    prepare = st.tuples(st.sampled_from(["corpus.txt", "ints.parquet", "missing", "stories-data", "secret.txt",
                                         *TOKEN_DIRS]),
                        st.lists(st.one_of(_flag("--out", p["out"]), _flag("--vocab-size", INTS),
                                           _flag("--val-fraction", FLOATS), _flag("--tokenizer", tokenizers),
                                           _flag("--eot", ["</s>", "<s>", "<nope>", ""]),
                                           st.just(["--overwrite"])), max_size=4)).map(
        lambda t: ["prepare", t[0], "--no-progress", *[x for f in t[1] for x in f]])
    sample = st.lists(st.one_of(_flag("--ckpt", p["ckpt"]), _flag("--temperature", FLOATS), _flag("--top-k", INTS),
                                _flag("--max-new-tokens", ["0", "3", "-1", "x"]), _flag("--prompt", ["", "Once", "\x00\udcff"]),
                                st.just(["--greedy"])), max_size=4).map(
        lambda fl: ["sample", "--max-new-tokens", "3", *[x for f in fl for x in f]])
    export = st.lists(st.one_of(_flag("--ckpt", p["ckpt"]), _flag("--out", p["export_out"]),
                                _flag("--dtype", ["bf16", "f32", "f16"]), st.just(["--overwrite"])), max_size=4).map(
        lambda fl: ["export", *[x for f in fl for x in f]])
    return st.one_of(train, prepare, sample, export, st.lists(st.sampled_from(["", "bogus", "--help", "-x"]), max_size=2))


def _written_dirs(argv, cwd: Path):
    """Where a command may write: its cwd, and its --out (resolved from the cwd) unless that is
    a checkpoint, which export must refuse."""
    dirs = [cwd]
    for flag, value in zip(argv, argv[1:]):
        if flag == "--out" and value and not (argv[0] == "export" and value.startswith("ckpt")):
            dirs.append(cwd / value)
    if argv[:1] == ["prepare"] and argv[1] in TOKEN_DIRS and "--out" not in argv:
        dirs.append(cwd / argv[1])  # prepared in place
    return dirs


@fuzz_settings(40)
@given(data=st.data())
def test_cli_fails_cleanly_and_touches_only_its_out(worker, sandbox, data):
    argv = data.draw(_argv(sandbox))
    # Paths are relative to the sandbox: run each case from a fresh directory beside it, with
    # the sandbox's entries reachable under the same names.
    cwd = sandbox / "outs" / f"case{len(list((sandbox / 'outs').iterdir()))}"
    cwd.mkdir()
    for entry in SANDBOX:
        if (sandbox / entry).exists():
            (cwd / entry).symlink_to(sandbox / entry)
    (cwd / "outs").mkdir()
    written = _written_dirs(argv, cwd)
    before = snapshot(sandbox, skip=written)
    case = {"kind": "cli", "argv": argv, "cwd": str(cwd)}
    check_cli_outcome(case, worker.run(case))
    assert snapshot(sandbox, skip=written) == before, f"files outside {written} changed by {argv}"


# ---------------------------------------------------------------- edited checkpoints

def _json_paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _json_paths(v, prefix + (i,))


MUTANTS = [None, 0, -1, 1.5, True, "x", "", [], {}, 10**12, 2**64, -2**63 - 1, 10**100,
           float("nan"), float("inf"), "../../secret.txt", "/etc/passwd", "tokenizer.json",
           "model.safetensors", ".", "..", [[[[[[1]]]]]], {"nested": {"deeper": [None]}},
           "tokenizer_config.json", "tokenizer.model", "tiktoken.json", "hf", "sentencepiece", "gpt2", "bpe"]
# The sandbox's checkpoints, one per tokenizer kind, and the files their tokenizers saved.
CHECKPOINTS = {"ckpt": ("tokenizer.json",), "ckpt-hf": ("tokenizer.json", "tokenizer_config.json"),
               "ckpt-spm": ("tokenizer.model", "tokenizer_config.json")}


def _mutate(meta, path, action, value):
    if not path:
        return value if action == "set" else meta
    parent = meta
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif action == "set":
        parent[last] = value
    elif action == "wrap":
        parent[last] = [parent[last]]
    return meta


@fuzz_settings(80)
@given(data=st.data())
def test_edited_checkpoints_are_refused_or_load(worker, sandbox, tmp_path, data):
    source = data.draw(st.sampled_from([c for c in CHECKPOINTS if (sandbox / c).exists()]), label="checkpoint")
    meta = json.loads((sandbox / source / "state.json").read_text())
    paths = sorted(set(_json_paths(meta)), key=lambda p: (len(p), str(p)))
    path = data.draw(st.sampled_from(paths), label="path")
    action = data.draw(st.sampled_from(["set", "set", "delete", "wrap"]), label="action")
    value = data.draw(st.sampled_from(MUTANTS), label="value")
    ckpt = tmp_path / f"ckpt{len(list(tmp_path.iterdir()))}"
    shutil.copytree(sandbox / source, ckpt)
    (ckpt / "state.json").write_text(json.dumps(_mutate(meta, path, action, value)))
    if data.draw(st.booleans(), label="swap a tokenizer file for a link to a secret"):
        swapped = data.draw(st.sampled_from(CHECKPOINTS[source]), label="swapped file")
        (ckpt / swapped).unlink()
        (ckpt / swapped).symlink_to(sandbox / "secret.txt")
    before = snapshot(sandbox)
    export_to = tmp_path / (ckpt.name + "-hf")
    case = {"kind": "checkpoint", "path": str(ckpt), "export_to": str(export_to)}
    check_raised_cleanly(case, worker.run(case), expected=("ValueError",))  # CheckpointError, DataError
    assert snapshot(sandbox) == before
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        if (export_to / name).exists():
            assert (export_to / name).read_bytes() != b"the secret\n"
    shutil.rmtree(ckpt)
    shutil.rmtree(export_to, ignore_errors=True)


@fuzz_settings(12)
@given(data=st.data())
def test_resuming_edited_checkpoints_fails_cleanly(worker, sandbox, tmp_path, data):
    """The same mutations through `xtrain train --resume`, which also reads the loader state."""
    meta = json.loads((sandbox / "ckpt" / "state.json").read_text())
    paths = [p for p in _json_paths(meta) if p and p[0] in ("data", "step", "optimizer", "rng", "train_args")]
    path = data.draw(st.sampled_from(sorted(paths, key=str)), label="path")
    meta = _mutate(meta, path, data.draw(st.sampled_from(["set", "delete"])), data.draw(st.sampled_from(MUTANTS)))
    ckpt = tmp_path / f"ckpt{len(list(tmp_path.iterdir()))}"
    shutil.copytree(sandbox / "ckpt", ckpt)
    (ckpt / "state.json").write_text(json.dumps(meta))
    out = tmp_path / (ckpt.name + "-run")
    case = {"kind": "cli", "cwd": str(tmp_path), "argv": [
        "train", "--resume", str(ckpt), "--data", str(sandbox / "stories-data"), "--out", str(out), "--steps", "3",
        "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "2", "--no-progress"]}
    check_cli_outcome(case, worker.run(case))
