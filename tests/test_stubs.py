"""The committed type stubs of xtrain._C (python/xtrain/_C/*.pyi) describe the module under test.

scripts/gen_stubs.sh regenerates the stubs from the imported module into a temporary directory;
each committed file must declare what the fresh one declares: the same names (functions, classes,
methods, properties, attributes, __all__), each function with the same parameters (names, kinds,
defaults), decorators and docstring. Type annotations and imports are left out of the comparison:
how a type is spelled follows the pybind11 and pybind11-stubgen versions, not this repository.

The committed stubs describe a build with NCCL (CI's). A build without NCCL has a smaller
xtrain._C.dist (is_available() is False and Communicator raises); there dist.pyi is checked for
the names that build has, the other files in full.
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import xtrain

pytest.importorskip("pybind11_stubgen", reason="pybind11-stubgen (the `test` extra) generates the stubs")

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "python" / "xtrain" / "_C"
REGENERATE = "scripts/gen_stubs.sh <PYTHONPATH of a CUDA build with NCCL, e.g. build-cuda/pkg>"


def _params(args: ast.arguments) -> str:
    """A signature without annotations: names, kinds (/, *, **) and defaults."""
    parts = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(positional, defaults)):
        parts.append(a.arg if d is None else f"{a.arg}={ast.unparse(d)}")
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            parts.append("/")
    if args.vararg:
        parts.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        parts.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        parts.append(a.arg if d is None else f"{a.arg}={ast.unparse(d)}")
    if args.kwarg:
        parts.append("**" + args.kwarg.arg)
    return ", ".join(parts)


def _declarations(body, prefix=""):
    """{qualified name: description} for the statements of a module or class body; overloads of
    one name are numbered in order."""
    out = {}

    def add(name, what):
        key, n = prefix + name, 1
        while key in out:
            n += 1
            key = f"{prefix}{name}#{n}"
        out[key] = what

    for node in body:
        if isinstance(node, ast.FunctionDef):
            decorators = " ".join("@" + ast.unparse(d) for d in node.decorator_list)
            add(node.name, f"{decorators} def ({_params(node.args)}) doc={ast.get_docstring(node)!r}".strip())
        elif isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            add(node.name, f"class ({bases}) doc={ast.get_docstring(node)!r}")
            out.update(_declarations(node.body, f"{prefix}{node.name}."))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = ast.unparse(node.value) if node.target.id == "__all__" and node.value else ""
            add(node.target.id, f"attribute {value}".strip())
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    add(t.id, "attribute")
    return out


def declarations(path: Path):
    return _declarations(ast.parse(path.read_text()).body)


def differences(committed, fresh):
    lines = []
    for name in sorted(set(fresh) - set(committed)):
        lines.append(f"  the module has {name}: {fresh[name]}; the stubs lack it")
    for name in sorted(set(committed) - set(fresh)):
        lines.append(f"  the stubs have {name}, which the module no longer has")
    for name in sorted(set(committed) & set(fresh)):
        if committed[name] != fresh[name]:
            lines.append(f"  {name}:\n    stubs:  {committed[name]}\n    module: {fresh[name]}")
    return lines


@pytest.fixture(scope="module")
def fresh_stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("stubs")
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gen_stubs.sh"), "--into", str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"scripts/gen_stubs.sh failed:\n{r.stdout}\n{r.stderr}"
    return out


def test_stub_files_are_the_modules(fresh_stubs):
    assert sorted(p.name for p in COMMITTED.glob("*.pyi")) == sorted(p.name for p in fresh_stubs.glob("*.pyi")), (
        f"python/xtrain/_C holds other stub files than the module has submodules; regenerate: {REGENERATE}")


@pytest.mark.parametrize("name", ["__init__.pyi", "cuda.pyi", "ops.pyi", "optim.pyi", "dist.pyi"])
def test_committed_stubs_match_the_module(fresh_stubs, name):
    committed, fresh = declarations(COMMITTED / name), declarations(fresh_stubs / name)
    if name == "dist.pyi" and not xtrain._C.dist.is_available():
        missing = sorted(set(fresh) - set(committed))
        assert not missing, (f"python/xtrain/_C/dist.pyi lacks {missing}, which even this build without NCCL "
                             f"has; regenerate: {REGENERATE}")
        return
    lines = differences(committed, fresh)
    assert not lines, (f"python/xtrain/_C/{name} is stale ({len(lines)} differences); regenerate the stubs with "
                       f"{REGENERATE}\n" + "\n".join(lines[:40]))
