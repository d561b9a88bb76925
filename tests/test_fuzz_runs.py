"""Fuzzing and concurrency of what surrounds a run (issue 36): --init-from directories,
prepare's inputs (links, special files, odd files), sample/generate arguments, and commands run at
the same time on one run directory.

Properties, as in tests/test_fuzz.py: a case succeeds or fails with an expected exception carrying
a message (the CLI: one `xtrain: error:` line), never a native crash, an internal error, an
unbounded allocation (the worker's address space is capped: such a case fails with MemoryError)
or a hang (the worker's timeout); prepare never reads a file outside its source; and two commands
on one run never leave it unloadable. Derandomized and bounded (about a minute on two cores).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzhelp import Worker, check_cli_outcome, check_raised_cleanly, fuzz_settings, snapshot
from modelhelp import cli_env, prepared_stories, run_cli

# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def worker():
    w = Worker(timeout=60)
    yield w
    w.close()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Prepared data, a trained run, its export (a Hugging Face directory), a secret file."""
    root = tmp_path_factory.mktemp("fuzz-runs")
    data = prepared_stories(root)
    r = run_cli("train", "--preset", "tiny", "--steps", "2", "--data", data, "--out", root / "run",
                "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "2", "--no-progress",
                "--device", "cpu", cwd=root)
    assert r.returncode == 0, r.stderr
    r = run_cli("export", "--ckpt", root / "run", "--out", root / "hf", "--dtype", "f32")
    assert r.returncode == 0, r.stderr
    (root / "secret.txt").write_text("the secret password\n")
    return root


# ---------------------------------------------------------------- --init-from directories

CONFIG_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "rms_norm_eps",
               "tie_word_embeddings", "architectures", "model_type", "rope_scaling", "hidden_act"]
CONFIG_VALUES = [None, 0, -1, 1, 2, 3, 1.5, True, "x", [], {}, 10**12, 2**31 - 1, 2**31, 2**63, 10**100,
                 1e12, 1e308, {"float": "nan"}, {"float": "inf"}, ["LlamaForCausalLM"], ["GPT2LMHeadModel"],
                 {"rope_type": "yarn"}, "gelu"]
HEADER_EDITS = ["offsets_out", "offsets_overlap", "offsets_reversed", "shape_huge", "shape_negative", "dtype_f64",
                "dtype_odd", "length_huge", "length_short", "not_json", "truncate_data", "drop_tensor",
                "nan_weight"]
FILE_EDITS = ["none", "config_fifo", "config_link_secret", "config_sparse_huge", "config_deep", "index_bad",
              "index_names_secret", "index_sparse_huge", "tokenizer_link_secret", "tokenizer_sparse_huge",
              "tokenizer_corrupt", "tokenizer_config_fifo", "weights_dir", "weights_missing"]


def _json_value(v):
    if isinstance(v, dict) and "float" in v:
        return float(v["float"])
    return v


def _edit_header(f: Path, edit: str):
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    names = sorted(k for k in header if k != "__metadata__")
    a, b = header[names[0]], header[names[1]]
    data = raw[8 + n:]
    if edit == "offsets_out":
        a["data_offsets"] = [0, len(data) + 4]
    elif edit == "offsets_overlap":
        b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + b["data_offsets"][1] - b["data_offsets"][0]]
    elif edit == "offsets_reversed":
        a["data_offsets"] = a["data_offsets"][::-1]
    elif edit == "shape_huge":
        a["shape"] = [2**40, 2**40]
    elif edit == "shape_negative":
        a["shape"] = [-1]
    elif edit == "dtype_f64":
        a["dtype"] = "F64"
    elif edit == "dtype_odd":
        a["dtype"] = 7
    elif edit == "drop_tensor":
        del header[names[0]]
    elif edit == "nan_weight":
        start = 8 + n + a["data_offsets"][0]
        f.write_bytes(raw[:start] + b"\x00\x00\xc0\x7f" + raw[start + 4:])
        return
    text = json.dumps(header).encode()
    if edit == "length_huge":
        f.write_bytes((2**62).to_bytes(8, "little") + text + data)
    elif edit == "length_short":
        f.write_bytes((len(text) - 3).to_bytes(8, "little") + text + data)
    elif edit == "not_json":
        f.write_bytes(len(text).to_bytes(8, "little") + b"{" * len(text) + data)
    elif edit == "truncate_data":
        f.write_bytes(len(text).to_bytes(8, "little") + text + data[: len(data) // 2])
    else:
        f.write_bytes(len(text).to_bytes(8, "little") + text + data)


def _edit_files(path: Path, edit: str, secret: Path):
    def sparse(f, size):
        f.unlink(missing_ok=True)
        with open(f, "wb") as fh:
            fh.truncate(size)
    if edit == "config_fifo":
        (path / "config.json").unlink()
        os.mkfifo(path / "config.json")
    elif edit == "config_link_secret":
        (path / "config.json").unlink()
        (path / "config.json").symlink_to(secret)
    elif edit == "config_sparse_huge":
        sparse(path / "config.json", 1 << 30)
    elif edit == "config_deep":
        (path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    elif edit == "index_bad":
        (path / "model.safetensors.index.json").write_text('{"weight_map": {"a": 3}}')
    elif edit == "index_names_secret":
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": str(secret)}}))
    elif edit == "index_sparse_huge":
        sparse(path / "model.safetensors.index.json", 1 << 30)
    elif edit == "tokenizer_link_secret":
        (path / "tokenizer.json").unlink()
        (path / "tokenizer.json").symlink_to(secret)
    elif edit == "tokenizer_sparse_huge":
        sparse(path / "tokenizer.json", 1 << 31)
    elif edit == "tokenizer_corrupt":
        (path / "tokenizer.json").write_text((path / "tokenizer.json").read_text()[:200])
    elif edit == "tokenizer_config_fifo":
        (path / "tokenizer_config.json").unlink()
        os.mkfifo(path / "tokenizer_config.json")
    elif edit == "weights_dir":
        (path / "model.safetensors").unlink()
        (path / "model.safetensors").mkdir()
    elif edit == "weights_missing":
        (path / "model.safetensors").unlink()


@fuzz_settings(60)
@given(data=st.data())
def test_init_from_directories_fail_cleanly(worker, sandbox, tmp_path, data):
    path = tmp_path / f"hf{len(list(tmp_path.iterdir()))}"
    shutil.copytree(sandbox / "hf", path)
    config = json.loads((path / "config.json").read_text())
    for key in data.draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=3, unique=True), label="keys"):
        value = data.draw(st.sampled_from(CONFIG_VALUES + ["<delete>"]), label=key)
        if value == "<delete>":
            config.pop(key, None)
        else:
            config[key] = _json_value(value)
    (path / "config.json").write_text(json.dumps(config))
    header = data.draw(st.sampled_from(["none"] * 4 + HEADER_EDITS), label="header")
    if header != "none":
        _edit_header(path / "model.safetensors", header)
    _edit_files(path, data.draw(st.sampled_from(FILE_EDITS), label="files"), sandbox / "secret.txt")
    case = {"kind": "pretrained", "path": str(path)}
    outcome = worker.run(case)
    check_raised_cleanly(case, outcome, expected=("ValueError",))  # PretrainedError, DataError
    assert "the secret password" not in outcome.get("message", "")
    shutil.rmtree(path)


# ---------------------------------------------------------------- prepare's inputs

SOURCE_ENTRIES = ["text", "text", "jsonl", "link_in", "link_out_file", "link_out_dir", "link_dangling",
                  "link_loop", "fifo", "socket", "empty", "binary", "bad_jsonl", "nested_dir", "dir_named_txt"]


def _make_entry(src: Path, kind: str, i: int, secret: Path):
    name = f"e{i}"
    if kind == "text":
        (src / f"{name}.txt").write_text("".join(f"Story {j} of {name}: a cat sat.\n\n" for j in range(60)))
    elif kind == "jsonl":
        (src / f"{name}.jsonl").write_text("".join(json.dumps({"text": f"doc {j} {name}"}) + "\n" for j in range(60)))
    elif kind == "link_in":
        target = src / f"{name}-target.txt"
        target.write_text("inside text\n\nmore inside text\n")
        (src / f"{name}.txt").symlink_to(target)
    elif kind == "link_out_file":
        (src / f"{name}.txt").symlink_to(secret)
    elif kind == "link_out_dir":
        (src / name).symlink_to(secret.parent, target_is_directory=True)
    elif kind == "link_dangling":
        (src / f"{name}.txt").symlink_to(src / "nowhere.txt")
    elif kind == "link_loop":
        (src / f"{name}.txt").symlink_to(src / f"{name}.txt")
    elif kind == "fifo":
        os.mkfifo(src / f"{name}.txt")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(src / f"{name}.txt"))
        except OSError:  # a socket path too long for sun_path: a FIFO stands in
            os.mkfifo(src / f"{name}.txt")
        finally:
            s.close()
    elif kind == "empty":
        (src / f"{name}.txt").write_text("")
    elif kind == "binary":
        (src / f"{name}.txt").write_bytes(bytes(range(256)) * 40)
    elif kind == "bad_jsonl":
        (src / f"{name}.jsonl").write_text('{"text": 3}\n')
    elif kind == "nested_dir":
        (src / name).mkdir()
        (src / name / "inner.txt").write_text("".join(f"Nested {j}.\n\n" for j in range(40)))
    elif kind == "dir_named_txt":
        (src / f"{name}.txt").mkdir()


@fuzz_settings(30)
@given(data=st.data())
def test_prepare_inputs_fail_cleanly_and_read_nothing_outside(worker, sandbox, tmp_path, data):
    case_dir = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    src = case_dir / "src"
    src.mkdir(parents=True)
    kinds = data.draw(st.lists(st.sampled_from(SOURCE_ENTRIES), min_size=1, max_size=4), label="entries")
    for i, kind in enumerate(kinds):
        _make_entry(src, kind, i, sandbox / "secret.txt")
    source = data.draw(st.sampled_from(["dir", "dir", "first"]), label="source")
    named = str(src) if source == "dir" else str(next(iter(sorted(src.iterdir()))))
    out = case_dir / "out"
    argv = ["prepare", named, "--out", str(out), "--no-progress", "--vocab-size", "300", "--val-fraction", "0.2"]
    before = snapshot(sandbox)
    case = {"kind": "cli", "argv": argv, "cwd": str(case_dir)}
    outcome = worker.run(case)
    check_cli_outcome(case, outcome)
    assert snapshot(sandbox) == before
    if outcome["code"] == 0:
        meta = json.loads((out / "meta.json").read_text())
        for f in meta["source"]["files"]:
            real = Path(f).resolve()
            assert real == Path(named).resolve() or Path(named).resolve() in real.parents, (f, kinds)
        assert b"secret password" not in (out / "tokenizer.json").read_bytes()


# ---------------------------------------------------------------- sample and generate arguments

PROMPTS = [{"list": [1, 2, 3]}, {"list": [{"list": [1, 2]}, {"list": [3]}]}, {"list": []}, {"list": [-1]},
           {"list": [64]}, {"list": [2**63]}, {"list": [1.5]}, "text", None, {"list": [{"list": []}]},
           {"list": [1] * 30}, {"tensor": {"shape": [1, 3], "dtype": "int64", "fill": "ids", "grad": False}},
           {"tensor": {"shape": [2, 2], "dtype": "float32", "fill": "randn", "grad": False}}]
ODD_NUMBERS = [0, 1, 3, -1, 2**31, 2**63, 2**64, 10**400, 0.5, True, None, "3", {"float": "nan"},
               {"float": "inf"}, {"float": "-inf"}, 1e308]


@fuzz_settings(60)
@given(prompt=st.sampled_from(PROMPTS), max_new=st.sampled_from(ODD_NUMBERS),
       kwargs=st.fixed_dictionaries({}, optional={
           "temperature": st.sampled_from(ODD_NUMBERS), "top_k": st.sampled_from(ODD_NUMBERS),
           "top_p": st.sampled_from(ODD_NUMBERS), "greedy": st.sampled_from([True, False, "yes", None]),
           "seed": st.sampled_from(ODD_NUMBERS + ["x"]), "stop_token": st.sampled_from(ODD_NUMBERS),
           "pad_token": st.sampled_from(ODD_NUMBERS), "cuda_graphs": st.sampled_from([True, False, "no"]),
           "generator": st.sampled_from([{"rng": 3}, "x", 5, None])}))
def test_generate_arguments_fail_cleanly(worker, prompt, max_new, kwargs):
    case = {"kind": "generate", "args": [prompt, max_new],
            "kwargs": {k: (v if not (isinstance(v, int) and abs(v) > 2**62) else {"int": str(v)})
                       for k, v in kwargs.items()}}
    if isinstance(max_new, int) and abs(max_new) > 2**62:
        case["args"][1] = {"int": str(max_new)}
    check_raised_cleanly(case, worker.run(case))


SAMPLE_FLAGS = {"--max-new-tokens": ["0", "1", "18446744073709551616", "99999999999999999999999", "-1", "x"],
                "--temperature": ["0", "0.8", "1e308", "nan", "-1"], "--top-k": ["1", "50", "10000000000", "0"],
                "--top-p": ["0.9", "1", "0", "1.5", "nan"], "--seed": ["0", "18446744073709551615",
                                                                       "18446744073709551616", "-1"],
                "--prompt": ["", "Once", "ab\udcff\udcfe", "\x00", "x" * 5000], "--device": ["cpu", "tpu", ""],
                "--ckpt": ["run", "run/ckpt", "hf", "secret.txt", "missing"]}


@fuzz_settings(30)
@given(flags=st.lists(st.sampled_from(sorted(SAMPLE_FLAGS)), max_size=4), data=st.data())
def test_sample_command_lines_fail_cleanly(worker, sandbox, flags, data):
    argv = ["sample", "--ckpt", "run", "--max-new-tokens", "2"]
    for flag in flags:
        argv += [flag, data.draw(st.sampled_from(SAMPLE_FLAGS[flag]), label=flag)]
    if data.draw(st.booleans(), label="greedy"):
        argv.append("--greedy")
    before = snapshot(sandbox)
    case = {"kind": "cli", "argv": argv, "cwd": str(sandbox)}
    check_cli_outcome(case, worker.run(case))
    assert snapshot(sandbox) == before


# ---------------------------------------------------------------- concurrent commands on one run

TRAIN = ["--preset", "tiny", "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "2",
         "--no-progress", "--device", "cpu"]


def _start(argv, cwd):
    return subprocess.Popen([sys.executable, "-m", "xtrain", *map(str, argv)], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _clean_end(proc, what):
    out, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "internal error" not in err, (what, err)
    if proc.returncode != 0:
        assert proc.returncode == 2 and lines and lines[-1].startswith("xtrain: error: "), (what, err)
    return proc.returncode, lines[-1] if lines else ""


# (first, second): each a command on one run directory RUN (a finished 4-step run) or on RUN's data.
PAIRS = {
    "resume+sample": (["train", "--out", "RUN", "--resume", "--steps", "40", "--save-every", "2", "--no-progress"],
                      ["sample", "--ckpt", "RUN", "--max-new-tokens", "2"]),
    "resume+export": (["train", "--out", "RUN", "--resume", "--steps", "40", "--save-every", "2", "--no-progress"],
                      ["export", "--ckpt", "RUN", "--out", "EXPORT", "--overwrite", "--dtype", "f32"]),
    "resume+prepare-data": (["train", "--out", "RUN", "--resume", "--steps", "40", "--save-every", "2",
                             "--no-progress"],
                            ["prepare", "OTHER", "--out", "RUN/data", "--overwrite", "--no-progress"]),
    "resume+resume": (["train", "--out", "RUN", "--resume", "--steps", "40", "--save-every", "2", "--no-progress"],
                      ["train", "--out", "RUN", "--resume", "--steps", "50", "--no-progress"]),
    "resume+overwrite": (["train", "--out", "RUN", "--resume", "--steps", "40", "--save-every", "2", "--no-progress"],
                         ["train", "--data", "CORPUS", "--out", "RUN", "--overwrite", "--steps", "2", *TRAIN]),
    "prepare+prepare": (["prepare", "CORPUS", "--out", "RUN/data2", "--no-progress"],
                        ["prepare", "OTHER", "--out", "RUN/data2", "--no-progress"]),
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("concurrent")
    (root / "corpus.txt").write_text("".join(f"Story {i}: the cat sat on mat {i % 9}.\n\n" for i in range(500)))
    (root / "other.txt").write_text("".join(f"Tale {i}: a dog ran to tree {i % 5}.\n\n" for i in range(500)))
    r = run_cli("train", "--data", root / "corpus.txt", "--out", root / "run", "--steps", "4", *TRAIN)
    assert r.returncode == 0, r.stderr
    return root


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_two_commands_on_one_run_leave_it_loadable(finished_run, tmp_path, pair):
    from xtrain.io import rundir, state

    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    names = {"RUN": str(run), "EXPORT": str(tmp_path / "hf"), "CORPUS": str(finished_run / "corpus.txt"),
             "OTHER": str(finished_run / "other.txt")}

    def argv(cmd):
        return [names.get(a, a.replace("RUN/", str(run) + "/") if a.startswith("RUN/") else a) for a in cmd]
    first, second = PAIRS[pair]
    a = _start(argv(first), tmp_path)
    if first[0] == "train":  # under way: its header is printed once it has set up and holds the run
        while not a.stdout.readline().startswith("xtrain: ") and a.poll() is None:
            pass
    else:
        time.sleep(1.0)
    b = _start(argv(second), tmp_path)
    results = [_clean_end(b, second), _clean_end(a, first)]
    assert any(code == 0 for code, _ in results), results
    if pair.startswith("resume+"):
        assert results[1][0] == 0, results  # the run itself went on to the end
        ckpt = state.load(run / "ckpt")  # and its checkpoint loads
        assert ckpt.step == 40
        assert not (run / "ckpt.tmp").exists() and not (run / rundir.LOCK_FILE).exists()
        steps = [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()
                 if "loss" in json.loads(line)]
        assert steps == list(range(ckpt.step)), steps  # the log agrees with the checkpoint
    if pair == "resume+prepare-data":
        assert results[0][0] == 2 and "in use by xtrain train" in results[0][1], results
    if pair in ("resume+resume", "resume+overwrite"):
        assert results[0][0] == 2 and "in use by xtrain train" in results[0][1], results
    if pair == "prepare+prepare":  # refused while the first prepares, or after: prepared differently
        assert results[0][0] == 2 and ("in use by xtrain prepare" in results[0][1]
                                       or "prepared differently" in results[0][1] or "holds a dataset" in results[0][1])
