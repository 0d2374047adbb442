"""The package's imports run one way (docs/architecture.md): no module imports itself back
through others (any import counts: a function's, or one for type checking only), and the
lower layers never import the upper ones. Read from the source with `ast`; nothing is
imported."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LOWER = ("model", "parallel", "cache", "runtime", "sampling", "loaders", "grammar")
UPPER = ("engine", "server", "lang", "disagg", "api")
# the server and the frontend language share api/ (below both), never each other; the
# engine sees disaggregation only through its own interface (engine/handoff.py)
APART = {("server", "lang"), ("lang", "server"), ("api", "server"), ("api", "lang"),
         ("engine", "disagg")}


def _graph() -> dict[str, set[str]]:
    """radixjax module -> the radixjax modules it imports."""
    files = {".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (SRC / "radixjax").rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    cycles = []
    for start in graph:  # a path from each module's targets back to it
        seen, stack = set(), [(t, [start, t]) for t in graph[start]]
        while stack:
            node, path = stack.pop()
            if node == start:
                cycles.append(" -> ".join(path))
                break
            if node not in seen:
                seen.add(node)
                stack.extend((t, [*path, t]) for t in graph[node])
    assert not cycles, "\n".join(cycles)


def test_lower_layers_never_import_upper_ones() -> None:
    bad = [f"{m} -> {t}" for m, targets in _graph().items() for t in targets
           if (_layer(m) in LOWER and _layer(t) in UPPER) or (_layer(m), _layer(t)) in APART]
    assert not bad, "\n".join(bad)
