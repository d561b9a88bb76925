"""One source of truth for the configuration of `xtrain train` (xtrain.trainer.runconfig): the
flags are TrainConfig's fields (and CommandOptions'), each help says its default once and rightly,
a value is read and checked alike from a flag, a config file and a TrainConfig, the TOML keys
are the options' names and their flags' names, and `xtrain --version`."""

import dataclasses
import re

import pytest

import xtrain
from modelhelp import run_cli
from xtrain.trainer import runconfig
from xtrain.trainer.cli import build_parser, main
from xtrain.trainer.runconfig import MACHINE_DEFAULTS, CommandOptions, ConfigError, TrainConfig

# A valid value, as TOML writes it, of each option whose default is None (the others use theirs).
SAMPLES = {"preset": "tiny", "init_from": "hf/qwen3", "data": "data/x", "grad_accum": 2, "batch_tokens": "0.5M",
           "lr": 1e-3, "min_lr": 1e-4, "decay_steps": 10, "memory_limit": "40G", "threads": 2, "save_every": 500,
           "sample_prompt": "Hi", "rendezvous": "tcp:host:29500", "resume": "runs/x/ckpt", "config": "run.toml"}


def _train_parser():
    return build_parser()._subparsers._group_actions[0].choices["train"]


def _help_entries(monkeypatch, columns=1000) -> dict:
    """`xtrain train --help`, unwrapped: the first flag of each entry -> the entry's text."""
    monkeypatch.setenv("COLUMNS", str(columns))
    entries, flag = {}, None
    for line in _train_parser().format_help().splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line
        elif flag is not None and line.startswith("   "):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return entries


def _given(*argv) -> dict:
    """The train flags of `argv`, read and checked: option name -> value (what the CLI merges)."""
    args = vars(build_parser().parse_args(["train", *argv]))
    return {name: runconfig.value_of(name, value) for name, value in args.items() if name != "command"}


def test_the_flags_are_the_fields():
    """A field added to TrainConfig is a flag of `xtrain train`; nothing else is, but the declared
    CommandOptions."""
    parser = _train_parser()
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    command = {f.name for f in dataclasses.fields(CommandOptions)}
    assert command == {"config", "overwrite", "devices", "rendezvous"}
    assert dests == fields | command and not fields & command
    flags = {s for a in parser._actions for s in a.option_strings} - {"-h", "--help"}
    assert flags == {f for name in runconfig.OPTIONS for f in runconfig.flags_of(name)}
    named_apart = {"progress": ("--no-progress",), "shard_optimizer": ("--no-shard-optimizer",),
                   "trackers": ("--tracker",), "bf16": ("--bf16", "--fp32")}
    assert {name: runconfig.flags_of(name) for name in named_apart} == named_apart


def test_a_field_without_an_option_is_refused():
    @dataclasses.dataclass
    class Extended:
        steps: int = runconfig.opt(3, "steps", "batch and steps", ge=1)
        forgotten: int = 4

    with pytest.raises(TypeError, match=r"Extended.forgotten: declare it with opt\(\)"):
        runconfig._declared(Extended)
    with pytest.raises(TypeError, match="needs type="):
        runconfig.opt(None, "x", "model")
    with pytest.raises(TypeError, match="says what None means"):
        runconfig.opt(None, "x", "model", int)
    assert {runconfig.option(name).group for name in runconfig.OPTIONS} <= {None, *runconfig.GROUPS}


def _expected_default(name: str) -> str:
    o = runconfig.option(name)

    def show(value):
        if o.switch:
            return next((f for f, v in o.switch.items() if v is value), "off")
        if value is False and o.words:
            return "off"
        return f"{value:g}" if isinstance(value, float) else (",".join(value) or "none") if isinstance(value, tuple) \
            else str(value)

    if name in MACHINE_DEFAULTS["cpu"]:
        both = f"{show(MACHINE_DEFAULTS['cpu'][name])} on CPU, {show(MACHINE_DEFAULTS['cuda'][name])} on GPU"
        return both + (f"; {o.shown}" if o.shown else "")
    return o.shown if o.shown is not None else show(runconfig.default_of(name))


def test_each_help_says_its_default_once(monkeypatch):
    entries = _help_entries(monkeypatch)
    text = _train_parser().format_help()
    assert text.count("(default:") == len(runconfig.OPTIONS)
    for wrong in ("(default: None)", "(default: False)", "(default: True)", "(default: machine"):
        assert wrong not in text
    for name in runconfig.OPTIONS:
        entry = entries[runconfig.flags_of(name)[0]]
        assert entry.count("(default:") == 1, entry
        assert entry.endswith(f"(default: {_expected_default(name)})"), (name, entry)
    assert "(default: 16 on CPU, 32 on GPU)" in entries["--batch"]
    assert "(default: --fp32 on CPU, --bf16 on GPU)" in entries["--bf16"]
    assert "(default: off)" in entries["--recompute"] and "(default: --cuda-graphs)" in entries["--cuda-graphs"]
    # the per-preset learning rates the help names are the loop's
    from xtrain.trainer.train import PRESET_LR

    named = dict((p, float(v)) for v, p in re.findall(r"(\S+) for (\w+)", entries["--lr"]))
    assert named == {p: PRESET_LR[p] for p in ("tiny", "dim1024")}


def test_the_defaults_are_the_machine_table():
    """TrainConfig's own defaults are MACHINE_DEFAULTS' CPU column (its preset None is tiny)."""
    defaults = TrainConfig()
    assert set(MACHINE_DEFAULTS["cpu"]) == set(MACHINE_DEFAULTS["cuda"])
    for name, value in MACHINE_DEFAULTS["cpu"].items():
        assert getattr(defaults, name) == (None if name == "preset" else value), name
    assert runconfig.machine_defaults("cuda:1") == MACHINE_DEFAULTS["cuda"]
    assert runconfig.machine_defaults("cpu") == MACHINE_DEFAULTS["cpu"]


def test_help_sections_and_width(monkeypatch):
    text = _train_parser().format_help()
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["options", *runconfig.GROUPS]
    monkeypatch.setenv("COLUMNS", "80")
    assert max(map(len, _train_parser().format_help().splitlines())) <= 80


def test_special_flags():
    assert _given() == {}
    assert _given("--fp32") == {"bf16": False} and _given("--bf16") == {"bf16": True}
    assert _given("--recompute") == {"recompute": True}
    assert _given("--recompute", "off") == {"recompute": False}
    assert _given("--recompute", "auto") == {"recompute": "auto"}
    assert _given("--resume") == {"resume": ""} and _given("--resume", "r/ckpt") == {"resume": "r/ckpt"}
    assert _given("--no-progress", "--no-shard-optimizer", "--no-cuda-graphs", "--overwrite") == \
        {"progress": False, "shard_optimizer": False, "cuda_graphs": False, "overwrite": True}
    assert _given("--tracker", "TensorBoard, wandb,tensorboard") == {"trackers": ("tensorboard", "wandb")}
    assert _given("--memory-limit", "40G", "--batch-tokens", "0.5M") == {"memory_limit": 40 * 2**30,
                                                                          "batch_tokens": 2**19}
    assert _given("--batch", "auto", "--devices", "all") == {"batch": "auto", "devices": "all"}
    assert _given("--lr", "3e-3", "--seed", "18446744073709551615") == {"lr": 3e-3, "seed": 2**64 - 1}
    for pair in (("--bf16", "--fp32"), ("--no-cuda-graphs", "--cuda-graphs")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", *pair])


def _error(capsys, argv) -> str:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("flag, text, toml", [
    ("--steps", "-3", "-3"), ("--steps", "2.5", '"2.5"'), ("--dropout", "1.0", "1.0"), ("--lr", "0", "0"),
    ("--min-lr", "-1", "-1.0"), ("--grad-clip", "inf", "inf"), ("--beta2", "1", "1"), ("--decay-frac", "0", "0"),
    ("--seed", "18446744073709551616", "18446744073709551616"), ("--preset", "huge", '"huge"'),
    ("--schedule", "step", '"step"'), ("--memory-limit", "12XB", '"12XB"'), ("--memory-limit", "0", "0"),
    ("--batch", "many", '"many"'), ("--recompute", "maybe", '"maybe"'), ("--device", "tpu", '"tpu"'),
    ("--devices", "0", "0"), ("--rendezvous", "udp", '"udp"'), ("--threads", "0", "0"),
])
def test_a_bad_value_is_the_same_error_from_a_flag_a_file_and_a_train_config(tmp_path, capsys, flag, text, toml):
    cpu = ["--device", "cpu"] if flag != "--device" else []
    from_flag = _error(capsys, ["train", *cpu, flag, text])
    (tmp_path / "c.toml").write_text(f"{flag[2:]} = {toml}\n")
    from_file = _error(capsys, ["train", *cpu, "--config", str(tmp_path / "c.toml")])
    prefix = "xtrain: error: "
    assert from_flag.startswith(prefix + flag) and from_file == f"{prefix}--config {tmp_path / 'c.toml'}: " + \
        from_flag[len(prefix):], (from_flag, from_file)
    name = flag[2:].replace("-", "_")
    if name in runconfig._TRAIN_OPTIONS and text not in ("2.5", "many"):  # as the flag's text would give it
        value = {"-3": -3, "1.0": 1.0, "0": 0 if runconfig.option(name).type is int else 0.0, "-1": -1.0,
                 "inf": float("inf"), "1": 1.0, "18446744073709551616": 2**64, "12XB": "12XB"}.get(text, text)
        with pytest.raises(ConfigError) as e:
            runconfig.validate(TrainConfig(**{name: value}))
        assert str(e.value) == from_flag[len(prefix):]


def test_every_flag_is_a_toml_key():
    """Each option reads from TOML by its name and by each of its flags' names (fp32 = true,
    no-cuda-graphs = true, tracker = "wandb"), but those of the command line only."""
    for name in runconfig.OPTIONS:
        o = runconfig.option(name)
        sample = SAMPLES.get(name, runconfig.default_of(name))
        keys = [name.replace("_", "-")] + [f[2:] for f in runconfig.flags_of(name)]
        for key in keys:
            value = True if o.switch and f"--{key}" in o.switch else sample
            if not o.in_file:
                with pytest.raises(ConfigError, match=f"unknown key '{key}' .* command line only"):
                    runconfig.values_of({key: value}, "c.toml")
                continue
            got = runconfig.values_of({key: value}, "c.toml")
            assert list(got) == [name], key
    assert runconfig.values_of({"fp32": True, "no-cuda-graphs": True, "no_progress": True}, "f") == \
        {"bf16": False, "cuda_graphs": False, "progress": False}
    assert runconfig.values_of({"fp32": False, "tracker": "wandb", "memory-limit": "40G", "batch_tokens": 4096,
                                "trackers": ["TensorBoard"], "recompute": "auto", "lr": 1}, "f") == \
        {"bf16": True, "trackers": ("tensorboard",), "memory_limit": 40 * 2**30, "batch_tokens": 4096,
         "recompute": "auto", "lr": 1.0}


def test_the_record_uses_the_names_and_reads_older_records(tmp_path):
    record = runconfig.record_of(TrainConfig(trackers=("wandb",), shard_optimizer=False, threads=2, progress=False),
                                 devices=2)
    assert record["trackers"] == ("wandb",) and record["shard_optimizer"] is False and record["devices"] == 2
    assert not {"threads", "progress", "resume", "config", "overwrite", "rendezvous"} & set(record)
    runconfig.write_record(tmp_path / "config.toml", record)
    assert runconfig.values_of(runconfig.read_toml(tmp_path / "config.toml"), "r", record=True) == \
        {k: v for k, v in record.items() if v is not None}
    # a record written before the keys were the fields' names
    older = {"no_shard_optimizer": False, "tracker": "tensorboard,wandb", "steps": 30, "threads": 1}
    assert runconfig.values_of(older, "r", record=True) == \
        {"shard_optimizer": True, "trackers": ("tensorboard", "wandb"), "steps": 30}


def test_validate_checks_every_field_and_the_rules_between_them():
    runconfig.validate(TrainConfig())
    for kw, message in (({"preset": "huge"}, "--preset 'huge': invalid choice"),
                        ({"recompute": "maybe"}, "--recompute 'maybe': expected on, off or auto"),
                        ({"bf16": 1}, "--bf16 1: expected true or false"),
                        ({"steps": True}, "--steps True: expected an integer"),
                        ({"trackers": "wandb"}, "--tracker 'wandb': expected a comma-separated list"),
                        ({"lr": 1e-3, "min_lr": 1e-2}, "--min-lr 0.01 must be <= --lr 0.001"),
                        ({"init_from": "x", "preset": "tiny"}, "drop --preset tiny"),
                        ({"init_from": "x", "resume": "r"}, "give one of them")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            runconfig.validate(TrainConfig(**kw))


def test_version():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"xtrain {xtrain.__version__}" == "xtrain 0.1.0"
