"""Structure rules of the Python package that a refactor could silently break:
- no import cycles between xtrain's modules;
- the layers import only downward: the engine surface (the top-level modules: tensor, ops, nn,
  optim, cuda, graphs, store) < xtrain.data < xtrain.models < xtrain.io < xtrain.launch <
  xtrain.trainer. A module may import its own layer and the layers below it, never one above.
Imports inside functions count too: a lazy import only hides a cycle or an upward dependency. The
package root (__init__, which gathers the public surface) and __main__ (the command's entry) are
exempt from the layer rule."""
import ast
from pathlib import Path

import xtrain

PKG = Path(xtrain.__file__).resolve().parent
LAYERS = ["xtrain", "xtrain.data", "xtrain.models", "xtrain.io", "xtrain.launch", "xtrain.trainer"]
EXEMPT = {"xtrain", "xtrain.__main__"}


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


def _graph() -> dict:
    files = list(PKG.rglob("*.py"))
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


def layer_of(module: str) -> int:
    """Index in LAYERS of the deepest layer whose package holds `module` (top-level modules: 0)."""
    return max(i for i, pkg in enumerate(LAYERS) if module == pkg or module.startswith(pkg + "."))


def test_no_import_cycles_between_xtrain_modules():
    graph = _graph()
    assert len(graph) > 10 and "xtrain.trainer.train" in graph
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


def test_layers_import_only_downward():
    graph = _graph()
    upward = [f"{m} ({LAYERS[layer_of(m)]}) imports {n} ({LAYERS[layer_of(n)]})"
              for m, deps in sorted(graph.items()) if m not in EXEMPT
              for n in sorted(deps) if layer_of(n) > layer_of(m)]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_every_module_sits_in_a_layer_package():
    """The top level holds the engine surface only; everything else lives in a layer's package,
    so a new module cannot quietly land beside the engine."""
    engine = {"xtrain._libs", "xtrain._tensor_methods", "xtrain.tensor", "xtrain.ops", "xtrain.nn",
              "xtrain.optim", "xtrain.cuda", "xtrain.graphs", "xtrain.store", "xtrain.settings"}
    top = {m for m in _graph() if m.count(".") == 1 and m not in EXEMPT and m not in LAYERS}
    top -= {m for m in top if any(m == p for p in LAYERS)}
    assert top <= engine, f"top-level modules outside the engine surface: {sorted(top - engine)}"


def test_layer_rule_catches_an_upward_import():
    """The rule itself: a model module importing the trainer is flagged."""
    assert layer_of("xtrain.models.transformer") < layer_of("xtrain.trainer.train")
    assert layer_of("xtrain.nn") == 0 and layer_of("xtrain.data.stream") == 1
    assert layer_of("xtrain.launch.env") > layer_of("xtrain.io.state")
