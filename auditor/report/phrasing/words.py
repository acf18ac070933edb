"""What every rule's wording shares: :func:`phrase`, the :class:`Phrase` it returns, and the
phrases that recur across rules (the expected speed-up after a fix, the collectives others wait
in).

:func:`phrase_facts` dispatches on the type of a finding's facts; each ``phrasing/<rule>.py``
registers the wording of its rule's facts (``@phrase_facts.register``), and the package imports
them all, so a symptom's wording may word its cause's finding through :func:`phrase`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass, field
from functools import singledispatch

from auditor.analysis.findings import Finding


@dataclass(frozen=True)
class Phrase:
    """What a finding says: one summary line, and the change to make on each blamed rank."""

    summary: str = ""
    fixes: Mapping[int, str] = field(default_factory=dict)


@singledispatch
def phrase_facts(facts: object, finding: Finding) -> Phrase:
    """The words of ``finding`` from its ``facts``: registered per facts type by each rule's
    phrasing module."""
    raise TypeError(f"no wording for {type(facts).__name__} ({finding.kind})")


def phrase(finding: Finding) -> Phrase:
    """``finding``'s words, from its facts."""
    if finding.facts is None:  # transitional: a rule that still writes its own prose
        return Phrase(finding.summary, dict(finding.fixes))
    return phrase_facts(finding.facts, finding)


def with_expectation(fix: str, speedup: float | None) -> str:
    """``fix`` and the speed-up to expect from it, where it is worth naming (2% or more)."""
    if speedup is None or speedup < 1.02:
        return fix
    return f"{fix}; expect about {speedup:.1f}x"


def ops_text(ops: Iterable[str]) -> str:
    """Collective operations as one name: ``all_gather/ddp_allreduce``."""
    return "/".join(ops)


def s_if_one(items: Sized | int) -> str:
    """The verb's ``s`` for one subject: ``rank 1 waits`` but ``ranks 1, 2 wait``."""
    return "s" if _count(items) == 1 else ""


def it_or_them(items: Sized | int) -> str:
    """``it`` for one rank, ``them`` for several."""
    return "it" if _count(items) == 1 else "them"


def _count(items: Sized | int) -> int:
    return items if isinstance(items, int) else len(items)
