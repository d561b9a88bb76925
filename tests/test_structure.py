"""Structure rules that a refactor could silently break: no import cycles between xtrain's modules
(imports inside functions count too: a lazy import only hides a cycle), and the CUDA kernels' launch
rule (every launch through launch(), every kernel opening with pdl_sync(): with programmatic
dependent launch a kernel that touched memory before waiting would race its predecessor)."""
import ast
import re
from pathlib import Path

import xtrain

PKG = Path(xtrain.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set) -> set:
    """The xtrain modules `path` imports (the package root `xtrain` itself excluded)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # `from pkg import sub` imports the submodule; pkg itself only for other names
            targets = subs + ([base] if any(t not in modules for t in subs) else [])
        else:
            continue
        out |= {t for t in targets if t in modules and t != "xtrain"}
    out.discard(name)
    return out


def test_no_import_cycles_between_xtrain_modules():
    files = [p for p in PKG.rglob("*.py")]
    modules = {_module_name(p) for p in files}
    graph = {_module_name(p): _imports(p, modules) for p in files}
    assert len(graph) > 10 and "xtrain.train" in graph
    cycles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


CUDA_DIR = Path(__file__).resolve().parents[1] / "csrc" / "kernels" / "cuda"


def _cuda_sources():
    files = sorted(CUDA_DIR.glob("*.cu")) + sorted(CUDA_DIR.glob("*.cuh"))
    assert files, f"no CUDA sources under {CUDA_DIR}"
    return [(f, re.sub(r"//[^\n]*", "", f.read_text())) for f in files]  # comments dropped


def test_cuda_kernels_launch_through_launch():
    bad = [f.name for f, text in _cuda_sources() if "<<<" in text]
    assert not bad, f"<<<...>>> launches (use launch(), which sets programmatic dependent launch): {bad}"


def test_cuda_kernels_open_with_pdl_sync():
    count, bad = 0, []
    for f, text in _cuda_sources():
        for m in re.finditer(r"__global__\b", text):
            body = text.index("{", m.end())
            # the parameter list's braces (none in practice) would end the search early: check the name
            count += 1
            if not text[body + 1:].lstrip().startswith("pdl_sync();"):
                bad.append(f"{f.name}: {' '.join(text[m.start():body].split())[:100]}")
    assert count > 0
    assert not bad, "kernels whose first statement is not pdl_sync():\n" + "\n".join(bad)
