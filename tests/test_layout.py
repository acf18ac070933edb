"""The command line is one front door: ``auditor/cli/`` alone parses argv and reads the options'
``AUDITOR_*`` twins; every layer below takes a plain frozen config and never imports the CLI."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path

import auditor
import auditor.configs

PACKAGE = Path(auditor.__file__).parent
CLI = PACKAGE / "cli"


def _sources() -> Iterator[tuple[Path, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, path.read_text(encoding="utf-8")


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, text: str) -> Iterator[str]:
    """Every module ``path`` imports, relative imports made absolute; for ``from X import Y``
    both ``X`` and ``X.Y`` (Y may be a submodule)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _inside_cli(path: Path) -> bool:
    return path.is_relative_to(CLI)


# ``python -m auditor``: the other way in to the same CLI, not a layer.
ENTRY = PACKAGE / "__main__.py"


def test_the_sources_are_found() -> None:
    paths = [path for path, _ in _sources()]
    assert CLI / "__init__.py" in paths and PACKAGE / "commands" / "run.py" in paths
    assert not (PACKAGE / "cli.py").exists() and not (PACKAGE / "config.py").exists()


def test_argparse_only_under_the_cli_package() -> None:
    found = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path, text in _sources()
        if "argparse" in text and not _inside_cli(path)
    )
    assert found == [], f"argparse outside auditor/cli/: {found}"
    # And the CLI does use it (the check above is not vacuous).
    assert any("argparse" in text for path, text in _sources() if _inside_cli(path))


def test_no_module_outside_the_cli_imports_it() -> None:
    offenders = sorted(
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path, text in _sources()
        if not _inside_cli(path) and path != ENTRY
        for name in _imports(path, text)
        if name in ("auditor.cli", "argparse") or name.startswith(("auditor.cli.", "argparse."))
    )
    assert offenders == [], offenders


def test_the_entry_module_only_calls_the_cli() -> None:
    assert set(_imports(ENTRY, ENTRY.read_text(encoding="utf-8"))) == {
        "auditor.cli",
        "auditor.cli.main_entry",
    }


def test_the_import_walk_sees_relative_imports() -> None:
    # The check above relies on this: ``from . import run`` in auditor/cli/__init__.py is
    # auditor.cli.run, and ``from .options import X`` in auditor/cli/run.py is auditor.cli.options.
    init = CLI / "__init__.py"
    assert "auditor.cli.run" in set(_imports(init, init.read_text(encoding="utf-8")))
    run = CLI / "run.py"
    assert "auditor.cli.options" in set(_imports(run, run.read_text(encoding="utf-8")))


def test_configs_are_frozen_dataclasses_that_import_no_auditor_module() -> None:
    text = Path(auditor.configs.__file__).read_text(encoding="utf-8")
    imported = set(_imports(Path(auditor.configs.__file__), text))
    assert not {name for name in imported if name == "auditor" or name.startswith("auditor.")}
    classes = [
        obj
        for _, obj in inspect.getmembers(auditor.configs, inspect.isclass)
        if obj.__module__ == "auditor.configs" and dataclasses.is_dataclass(obj)
    ]
    assert len(classes) >= 8
    for cls in classes:
        assert cls.__dataclass_params__.frozen, cls.__name__
