"""The auditor's import graph, read from source with ``ast`` (nothing imported).

Module-level, function-level and ``if TYPE_CHECKING:`` imports all count, relative imports are
resolved, and ``from pkg import name`` counts as importing the module ``pkg.name`` where there is
one, else ``pkg``. The import-cycle test and the layer test read the same graph.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "auditor"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the auditor module imported
    path: Path
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(package: Path = PACKAGE) -> Iterator[Import]:
    """Every import of one auditor module by another, with the file and line it is on."""
    files = {module_name(p): p for p in sorted(package.rglob("*.py"))}
    for name, path in files.items():
        parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = parent.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [m for m in subs if m in files]
                if len(targets) < len(subs):
                    targets.append(base)
            for target in targets:
                while target and target not in files:  # the deepest auditor module named
                    target = target.rpartition(".")[0]
                if target and target != name:
                    yield Import(name, target, path, node.lineno)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every auditor module mapped to the auditor modules it imports."""
    graph: dict[str, set[str]] = {module_name(p): set() for p in package.rglob("*.py")}
    for imp in package_imports(package):
        graph[imp.source].add(imp.target)
    return graph
