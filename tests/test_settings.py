"""xtrain.settings: the one place the package reads XTRAIN_* environment variables, and
docs/settings.md's table of them."""
import re
from pathlib import Path

import pytest

import xtrain
from xtrain import settings

ROOT = Path(__file__).resolve().parents[1]
PKG = Path(xtrain.__file__).resolve().parent


def test_docs_table_lists_exactly_the_settings():
    text = (ROOT / "docs" / "settings.md").read_text()
    documented = set(re.findall(r"^\| `(XTRAIN_[A-Z_]+)` \|", text, re.M))
    assert documented == set(settings.SETTINGS)


def test_no_module_reads_an_xtrain_variable_but_settings():
    readers = []
    for path in PKG.rglob("*.py"):
        if path.name == "settings.py":
            continue
        for line in path.read_text().splitlines():
            if re.search(r"environ(\.get)?\s*[\[(]\s*[\"']XTRAIN_|getenv\(\s*[\"']XTRAIN_", line):
                readers.append(f"{path.relative_to(PKG)}: {line.strip()}")
    assert not readers, "XTRAIN_* read outside xtrain.settings:\n" + "\n".join(readers)


def test_unset_and_empty_give_the_default(monkeypatch):
    monkeypatch.delenv("XTRAIN_RENDEZVOUS_TIMEOUT", raising=False)
    assert settings.get("XTRAIN_RENDEZVOUS_TIMEOUT") == 600.0
    monkeypatch.setenv("XTRAIN_RENDEZVOUS_TIMEOUT", "")
    assert settings.get("XTRAIN_RENDEZVOUS_TIMEOUT") == 600.0
    monkeypatch.setenv("XTRAIN_RENDEZVOUS_TIMEOUT", "2.5")
    assert settings.get("XTRAIN_RENDEZVOUS_TIMEOUT") == 2.5


@pytest.mark.parametrize("name,text,message", [
    ("XTRAIN_HEARTBEAT_TIMEOUT", "soon", "not a number of seconds"),
    ("XTRAIN_HEARTBEAT_TIMEOUT", "-1", "must be > 0"),
    ("XTRAIN_DATA_WORKERS", "two", "integer >= 0"),
    ("XTRAIN_DATA_WORKERS", "-3", "integer >= 0"),
])
def test_bad_values_name_the_variable(monkeypatch, name, text, message):
    monkeypatch.setenv(name, text)
    with pytest.raises(ValueError, match=f"{name}.*{message}|{message}.*{name}"):
        settings.get(name)


def test_data_workers_and_debug(monkeypatch):
    monkeypatch.setenv("XTRAIN_DATA_WORKERS", "3")
    assert settings.get("XTRAIN_DATA_WORKERS") == 3
    monkeypatch.setenv("XTRAIN_DEBUG", "1")
    assert settings.get("XTRAIN_DEBUG") is True
    monkeypatch.delenv("XTRAIN_DEBUG")
    assert settings.get("XTRAIN_DEBUG") is False
