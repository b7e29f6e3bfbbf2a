"""relayrl's modules import each other without a circle, counting imports inside functions.

A function-local import that closes a circle still couples the two modules both ways; it only
moves the failure from import time to the first call. The graph is read from the source with
``ast``: every ``import`` / ``from ... import`` anywhere in a module (inside functions and classes
too), except those under ``if TYPE_CHECKING:``, which never run. ``from relayrl.x import y`` is an
edge to ``relayrl.x.y`` when ``y`` is a submodule, else to ``relayrl.x``; a package's ``__init__``
is the module named by the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import relayrl

ROOT = Path(relayrl.__file__).parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file for every module under ``root`` (``pkg/__init__.py`` is ``pkg``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import node in ``tree``, skipping the body (not the else) of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for sub in ast.iter_child_nodes(node):
            visit(sub)

    visit(tree)
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from`` import names, with relative levels resolved against ``module``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in (``relayrl.x.Thing``: ``relayrl.x``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the relayrl modules it imports anywhere (``if TYPE_CHECKING:`` blocks excepted)."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _absolute(node, name, is_package)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            edges |= {owner for t in targets if (owner := _owner(t, modules)) is not None}
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None: depth-first search with an on-stack set."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_graph_reads_local_submodule_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from pkg import top\n")
    (pkg / "top.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import leaf\n"
        "from pkg.sub import leaf as _l\n"
    )
    graph = import_graph(pkg)
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}
    assert graph["pkg.sub.leaf"] == {"pkg.top"}
    assert graph["pkg.top"] == {"pkg.sub.leaf"}
    assert find_cycle(graph) == ["pkg.sub.leaf", "pkg.top", "pkg.sub.leaf"]
    (pkg / "top.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from pkg.sub import leaf\n")
    assert find_cycle(import_graph(pkg)) is None
