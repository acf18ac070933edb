"""What a rule is: a kind, its thresholds, ``measure`` and ``decide``, and the rules that explain
it away. Each rule module declares one :class:`Rule` (``RULE = Rule(...)``); the registry
(:mod:`auditor.analysis.rules`) derives the kinds, the order, the cause graph and the engine's
inputs from those declarations.

* ``measure(snapshot, thresholds) -> Inputs | None``: the few figures the rule reads, per rank or
  per GPU, as a small typed record (None: nothing to judge, e.g. fewer than two ranks ready).
  Figures are at the ranks' pace (:meth:`Snapshot.ready`), the same numbers every table shows.
* ``decide(inputs, thresholds, explained) -> findings``: the decision, from those figures only;
  ``explained`` holds what the rules named in ``explained_by`` concluded (the ranks and GPUs they
  already explain, or the candidate causes of a symptom), handed over by the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Generic, TypeVar

from .findings import Finding
from .snapshot import Snapshot

T = TypeVar("T")  # the rule's thresholds: a frozen dataclass, every field with a default
I = TypeVar("I")  # the rule's inputs: a frozen dataclass of measured figures  # noqa: E741


@dataclass(frozen=True)
class Explained:
    """What the explaining rules concluded, in ``explained_by`` order (within a rule, its
    findings' order)."""

    findings: tuple[Finding, ...] = ()

    @property
    def ranks(self) -> frozenset[int]:
        """Ranks the explaining findings blame."""
        return frozenset(r for f in self.findings for r in f.ranks)

    @property
    def gpus(self) -> frozenset[str]:
        """GPUs (UUIDs) the explaining findings name."""
        return frozenset(g for f in self.findings for g in f.gpus)


@dataclass(frozen=True)
class Rule(Generic[T, I]):
    """One rule, declared once in its module.

    ``place`` is its place in listings (findings of equal severity and speed-up are listed in
    this order); a rule's ``explained_by`` rules must come before it (checked by the registry).
    """

    kind: str
    place: int
    thresholds: Callable[..., T]
    measure: Callable[[Snapshot, T], I | None]
    decide: Callable[[I, T, Explained], list[Finding]]
    explained_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.thresholds, type) and is_dataclass(self.thresholds)):
            raise TypeError(f"{self.kind}: thresholds must be a dataclass")

    @property
    def threshold_names(self) -> tuple[str, ...]:
        assert isinstance(self.thresholds, type) and is_dataclass(self.thresholds)
        return tuple(f.name for f in fields(self.thresholds))

    def settings(self, overrides: Mapping[str, Any] | None = None) -> T:
        """The thresholds with ``overrides`` applied; ValueError naming an unknown one."""
        overrides = dict(overrides or {})
        bad = sorted(set(overrides) - set(self.threshold_names))
        if bad:
            raise ValueError(
                f"{self.kind}: unknown threshold(s) {', '.join(bad)}; "
                f"thresholds: {', '.join(self.threshold_names)}"
            )
        return self.thresholds(**overrides)

    def judge(
        self, snapshot: Snapshot, settings: T, explained: Iterable[Finding] = ()
    ) -> list[Finding]:
        """Measure, then decide."""
        inputs = self.measure(snapshot, settings)
        if inputs is None:
            return []
        return self.decide(inputs, settings, Explained(tuple(explained)))

    def __call__(
        self, snapshot: Snapshot, explained: Iterable[Finding] = (), **thresholds: Any
    ) -> list[Finding]:
        """The rule alone on ``snapshot`` (tests, tools): thresholds as keywords, and the
        explaining findings where the engine would hand them over."""
        return self.judge(snapshot, self.settings(thresholds), explained)
