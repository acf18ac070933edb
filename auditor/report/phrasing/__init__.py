"""A finding in words: its summary and one concrete change per blamed rank.

Rules measure and decide; each leaves its conclusion as typed facts on the finding
(:class:`~auditor.analysis.findings.Finding`). This package words them, one module per rule
(``phrasing/<rule>.py`` words what ``analysis/rules/<rule>.py`` concludes), with the figure
formats of :mod:`auditor.wording`. Every renderer reaches a finding's words through
:func:`phrase`: the report model (:class:`~auditor.report.model.ReportFinding`, hence the
terminal verdict, the JSON and HTML reports and ``compare``), the live panel and serve's HTTP
answers.
"""

from __future__ import annotations

import importlib
import pkgutil

from .words import Phrase, phrase, phrase_facts

# Each module registers the wording of its rule's facts with phrase_facts on import; every module
# of the package is one (``words`` the shared phrases), so a new rule's wording is found as its
# rule is, by walking the package.
for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Phrase", "phrase", "phrase_facts"]
