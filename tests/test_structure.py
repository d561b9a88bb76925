"""Structure rules of the Python package that a refactor could silently break: no import cycles
between xtrain's modules (imports inside functions count too: a lazy import only hides a cycle)."""
import ast
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
