"""The package's shape: no import cycles between aiayn's modules, counting the imports inside
functions too (a lazy import that closes a cycle still ties the two modules together). A
`__main__` block is an entry point, and imports for type checkers only run no code: neither
counts."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _skipped(node: ast.stmt) -> bool:
    """`if TYPE_CHECKING:` and `if __name__ == "__main__":` blocks."""
    if not isinstance(node, ast.If):
        return False
    test = ast.unparse(node.test)
    return "TYPE_CHECKING" in test or "__name__" in test


def import_graph() -> dict[str, set[str]]:
    """module -> the aiayn modules it imports (`from a.b import c` is `a.b.c` when that is a
    module, else `a.b`)."""
    modules = _modules()

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for statement in ast.parse(path.read_text(encoding="utf-8")).body:
            if _skipped(statement):
                continue
            for node in ast.walk(statement):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    targets = [f"{node.module}.{alias.name}" for alias in node.names]
                else:
                    continue
                for target in filter(None, map(module_of, targets)):
                    if target != name:
                        graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_aiayn_has_no_import_cycles():
    graph = import_graph()
    assert "aiayn.training.run" in graph and "aiayn.config" in graph["aiayn.training.run"]
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(component) for component in found)
