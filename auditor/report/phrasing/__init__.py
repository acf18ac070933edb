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

# Each module registers the wording of its rule's facts with phrase_facts on import.
from . import (  # noqa: F401
    batch_split,
    compute_straggler,
    cpu_oversubscription,
    data_starvation,
    dataparallel_gather,
    hardware_straggler,
    idle_device,
    memory_headroom,
    memory_imbalance,
    memory_pressure,
    stall,
    utilization_imbalance,
)
from .words import Phrase, phrase, phrase_facts

__all__ = ["Phrase", "phrase", "phrase_facts"]
