"""The environment variables xtrain reads: every one of them is defined and parsed here, and listed
in docs/settings.md (a test keeps the two equal). Nothing else in the package reads os.environ for
an XTRAIN_* name.

    xtrain.settings.get("XTRAIN_DATA_WORKERS")     # None when unset, else the parsed value

These are settings of a machine or a launch, not of a run (those are TrainConfig's fields and the
command line's flags): where caches live, how many story workers a small machine affords, how long
ranks wait for each other, whether the CLI shows tracebacks. A bad value raises ValueError naming
the variable and what it accepts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


def _positive_seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{name}={text!r} must be > 0 seconds")
    return value


def _count(name: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{name} must be an integer >= 0, got {text!r}")
    return int(text)


def _text(name: str, text: str) -> str:
    return text


def _flag(name: str, text: str) -> bool:
    return True


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str, str], Any]
    default: Any
    help: str


SETTINGS = {s.name: s for s in (
    Setting("XTRAIN_CACHE", _text, None,
            "folder of the built-in stories' tokenizer and held-out set (default ~/.cache/xtrain/default)"),
    Setting("XTRAIN_DATA_WORKERS", _count, None,
            "story worker processes for `--data-workers auto` (default: one per two cores, minus one)"),
    Setting("XTRAIN_DEBUG", _flag, False,
            "any non-empty value: the command line shows the traceback of an internal error"),
    Setting("XTRAIN_RENDEZVOUS_HOST", _text, None,
            "the address other ranks reach rank 0 at (default 127.0.0.1 on one node)"),
    Setting("XTRAIN_RENDEZVOUS_TIMEOUT", _positive_seconds, 600.0,
            "seconds every rank has to join the rendezvous"),
    Setting("XTRAIN_HEARTBEAT_TIMEOUT", _positive_seconds, 30.0,
            "seconds a silent rank is given before it counts as failed"),
)}


def get(name: str):
    """The value of setting `name`: its default when the variable is unset or empty, else the
    parsed text."""
    setting = SETTINGS[name]
    text = os.environ.get(name)
    return setting.default if not text else setting.parse(name, text)
