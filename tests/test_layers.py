"""The package's layers, lowest first, and the check that no module imports a higher layer.

``LAYERS`` is the one table of the layers. A module may import its own layer and any layer below
it; importing a higher layer fails, naming the file, the line and both layers. Every module of
``auditor/`` must be in the table, so a new top-level module or package is placed on purpose.

The graph is read from source with ``ast`` (nothing is imported): module-level, function-level
and ``if TYPE_CHECKING:`` imports all count, relative imports are resolved, and ``from pkg
import name`` counts as importing the module ``pkg.name`` where there is one, else ``pkg``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.helpers.imports import PACKAGE, Import, module_name, package_imports

# Lowest first. A name is a module or a package (with everything under it); "auditor" is the
# top package's own ``__init__`` only.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Plain data and helpers that import no other auditor module.
    (
        "base",
        (
            "auditor",
            "auditor.samples",
            "auditor.files",
            "auditor.wording",
            "auditor.configs",
            "auditor.torchrun",
            "auditor.launch_env",
        ),
    ),
    # What is measured: inside the ranks (the probe), on the node (NVML, psutil, recordings).
    ("measure", ("auditor.probe", "auditor.telemetry")),
    # Pure analysis: snapshot, rules, findings.
    ("analysis", ("auditor.analysis",)),
    # The typed report and its renderings (terminal, JSON, HTML, compare, live panel).
    ("report", ("auditor.report",)),
    # The one audit: batches (or a snapshot) in, findings and a report out.
    ("audit", ("auditor.audit",)),
    # Prometheus: catalog, export state, exporter, query client, replay.
    ("metrics", ("auditor.metrics",)),
    # The domain services; peers here may import one another (liveview uses cluster.relay).
    ("services", ("auditor.cluster", "auditor.ops", "auditor.service", "auditor.liveview")),
    # One module per command: composes the layers below, takes a config, returns an exit code.
    ("commands", ("auditor.commands",)),
    # The parsers and the AUDITOR_* twins; dispatches to the commands.
    ("cli", ("auditor.cli",)),
    # ``python -m auditor``.
    ("entry", ("auditor.__main__",)),
)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of the module's layer (its longest listed prefix); None if none.
    The top package ("auditor") holds only its own ``__init__``, never what is under it."""
    index = {name: i for i, (_, names) in enumerate(layers) for name in names}
    parts = module.split(".")
    prefixes = [".".join(parts[:i]) for i in range(len(parts), 1, -1)] or [module]
    return next((index[p] for p in prefixes if p in index), None)


def violations(
    imports: Iterable[Import],
    layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS,
) -> list[str]:
    """One line per import of a higher layer: where it is, and which layer each side is in."""
    found = []
    for imp in imports:
        low, high = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if low is None or high is None or high <= low:
            continue
        found.append(
            f"{_where(imp)}: {imp.source} (layer {low} {layers[low][0]!r}) imports "
            f"{imp.target} (layer {high} {layers[high][0]!r}): a lower layer may not import a "
            "higher one"
        )
    return found


def _where(imp: Import) -> str:
    try:
        return f"{imp.path.relative_to(PACKAGE.parent)}:{imp.line}"
    except ValueError:
        return f"{imp.path}:{imp.line}"


def _modules() -> list[str]:
    return sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


# --------------------------------------------------------------------------------------------


def test_no_lower_layer_imports_a_higher_one() -> None:
    found = violations(package_imports())
    assert not found, "\n".join(["imports that run up the layers:", *found, _table()])


def test_every_module_is_in_a_layer() -> None:
    missing = [m for m in _modules() if layer_of(m) is None]
    assert not missing, f"modules in no layer (add them to LAYERS in {__file__}): {missing}"


def test_every_name_in_the_table_is_a_module_or_package() -> None:
    modules = set(_modules())
    listed = [name for _, names in LAYERS for name in names]
    assert len(listed) == len(set(listed)), "a name is listed in two layers"
    stale = [n for n in listed if n not in modules]
    assert not stale, f"LAYERS names what does not exist: {stale}"


def test_the_walk_sees_function_level_and_relative_imports() -> None:
    edges = {(i.source, i.target) for i in package_imports()}
    # ``from . import run`` in auditor/cli/__init__.py; a function-level import in a command.
    assert ("auditor.cli", "auditor.cli.run") in edges
    assert ("auditor.commands.reports", "auditor.report.html") in edges
    assert ("auditor.cli.run", "auditor.commands.run") in edges


def test_an_import_up_the_layers_is_named_with_both_layers(tmp_path: Path) -> None:
    layers = (("low", ("auditor.low",)), ("high", ("auditor.high",)))
    imp = Import("auditor.low", "auditor.high", tmp_path / "low.py", 3)
    assert violations([imp], layers) == [
        f"{tmp_path / 'low.py'}:3: auditor.low (layer 0 'low') imports auditor.high "
        "(layer 1 'high'): a lower layer may not import a higher one"
    ]
    down = Import("auditor.high", "auditor.low", tmp_path / "high.py", 1)
    assert violations([down], layers) == []


def test_layer_of_takes_the_longest_prefix_and_keeps_the_top_package_exact() -> None:
    assert layer_of("auditor") == 0
    assert layer_of("auditor.report.phrasing.batch_split") == _index("report")
    assert layer_of("auditor.cli.run") == _index("cli")
    assert layer_of("auditor.nothing_here") is None


def _index(name: str) -> int:
    return [n for n, _ in LAYERS].index(name)


def _table() -> str:
    return "layers, lowest first:\n" + "\n".join(
        f"  {i} {name}: {', '.join(names)}" for i, (name, names) in enumerate(LAYERS)
    )
