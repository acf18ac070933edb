"""No English under ``auditor/analysis/``: rules hand over figures, codes and typed facts; every
sentence a user reads is made in :mod:`auditor.report.phrasing`.

Docstrings and the messages of exceptions raised for programming errors (a developer's, not a
user's) are not findings' words and are allowed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import auditor.analysis

ROOT = Path(auditor.analysis.__file__).parent
PROSE = re.compile(r"[A-Za-z]+[ ,:;(][A-Za-z(]+ [A-Za-z]+")


def _docstrings(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _in_raise(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            out.update(id(n) for n in ast.walk(node))
    return out


def _prose(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    allowed = _docstrings(tree) | _in_raise(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in allowed
            and PROSE.search(node.value)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
        if isinstance(node, ast.JoinedStr) and id(node) not in allowed:
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if PROSE.search(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: f{text[:60]!r}")
    return found


def test_no_sentences_under_analysis() -> None:
    found = [line for path in sorted(ROOT.rglob("*.py")) for line in _prose(path)]
    assert not found, "\n".join(found)


def test_analysis_imports_no_wording() -> None:
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(("auditor.wording", "auditor.report")), (path, name)
