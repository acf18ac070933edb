"""The finding: what a rule concludes, with its evidence, blamed ranks, facts and speed-up.

A finding holds no prose. Its ``facts`` are the rule's typed conclusion (a frozen dataclass the
rule's module defines: the figures and decisions its summary and fixes need); the report layer
words them (:mod:`auditor.report.phrasing`), so a sentence changes in one place and a rule only
measures and decides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from .fixes import Fix

# The one severity order, least severe first: every place that ranks or sorts severities reads
# it through severity_rank / finding_order below.
SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
# The same order most severe first, for renderers that list findings top down.
SEVERITY_ORDER = tuple(reversed(SEVERITIES))


def severity_rank(severity: object) -> int:
    """A severity's place in :data:`SEVERITIES`; anything else (a foreign JSON's) ranks as info."""
    return SEVERITY_RANK.get(severity, 0) if isinstance(severity, str) else 0


def severity_key(severity: object) -> int:
    """Sort key, most severe first: :func:`severity_rank` reversed."""
    return len(SEVERITIES) - 1 - severity_rank(severity)


@dataclass(frozen=True)
class Finding:
    """One conclusion about the job.

    ``ranks`` are the ranks the finding blames (never the ranks that only wait for them);
    ``facts`` is the rule's typed conclusion, from which the report words the summary and one
    concrete change per blamed rank (:mod:`auditor.report.phrasing`); ``fixes`` are those
    changes as data (:class:`~auditor.analysis.fixes.Fix`); ``gpus`` the GPUs (UUIDs) it
    names; ``evidence`` is the measured record the JSON report carries (figures and codes, no
    words); ``predicted_speedup`` is the job's expected step-rate gain if every fix is applied,
    under the DDP barrier model (:mod:`auditor.analysis.advisor`), and ``predicted_range`` the
    least and the most it is sure of (:mod:`auditor.analysis.spread`; None where not judged).
    ``cause`` names the kind that explains a symptom finding such as ``utilization_imbalance``.
    """

    kind: str
    severity: str
    ranks: tuple[int, ...]
    facts: Any = None
    evidence: dict[str, Any] = field(default_factory=dict)
    predicted_speedup: float | None = None
    cause: str | None = None
    fixes: tuple[Fix, ...] = ()
    gpus: tuple[str, ...] = ()
    predicted_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        # The kind is checked where the registry is known: the engine refuses a finding of a
        # kind no rule declares (this module is below the registry).
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def severity_level(self) -> int:
        return SEVERITY_RANK[self.severity]

    def to_dict(self) -> dict[str, Any]:
        """The finding as plain data, its facts included (for comparing findings and for test
        messages; the report's JSON form, with words, is
        :meth:`auditor.report.model.ReportFinding.to_dict`)."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "ranks": list(self.ranks),
            "facts": (
                asdict(self.facts)
                if is_dataclass(self.facts) and not isinstance(self.facts, type)
                else self.facts
            ),
            "evidence": self.evidence,
            "predicted_speedup": self.predicted_speedup,
            "predicted_range": None if self.predicted_range is None else list(self.predicted_range),
            "cause": self.cause,
            "fixes": [fix.to_dict() for fix in self.fixes],
            "gpus": list(self.gpus),
        }


def severity_for(
    speedup: float | None, *, warning_at: float = 1.10, critical_at: float = 1.5
) -> str:
    """Severity from the predicted gain: what fixing it is worth to the whole job."""
    if speedup is None or speedup < warning_at:
        return "info"
    return "critical" if speedup >= critical_at else "warning"


def finding_order(f: Finding) -> tuple[int, float]:
    """Sort key: most severe first, then the largest predicted speed-up."""
    return (-f.severity_level, -(f.predicted_speedup or 1.0))
