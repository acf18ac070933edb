"""No import cycle among the auditor's modules, TYPE_CHECKING and function-level imports included.

The graph is built from source with ``ast`` (nothing imported), so an import hidden under
``if TYPE_CHECKING:`` or inside a function counts: such a cycle still couples the modules.
"""

from __future__ import annotations

from tests.helpers.imports import import_graph


def find_cycle(graph: dict[str, set[str]], within: str = "") -> list[str] | None:
    """One cycle among modules whose name starts with ``within``, as a path; None if none."""
    nodes = {n for n in graph if n.startswith(within)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n] & nodes):
            if state.get(m) == 1:
                return [*path[path.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_graph_sees_type_checking_and_relative_imports() -> None:
    graph = import_graph()
    assert "auditor.analysis.stats" in graph["auditor.analysis.snapshot"]
    assert "auditor.analysis.measures" in graph["auditor.analysis.rules.batch_split"]
    assert "auditor.analysis.rule" in graph["auditor.analysis.rules.batch_split"]


def test_find_cycle_reports_the_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_analysis() -> None:
    cycle = find_cycle(import_graph(), "auditor.analysis")
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_rule_imports_another_rule() -> None:
    graph = import_graph()
    rules = {n for n in graph if n.startswith("auditor.analysis.rules.")}
    crossed = {r: sorted(graph[r] & rules) for r in rules if graph[r] & rules}
    assert not crossed, crossed


def test_no_import_cycle_in_the_package() -> None:
    cycle = find_cycle(import_graph(), "auditor")
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
