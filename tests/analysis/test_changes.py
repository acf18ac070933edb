"""The live window's latest change: a live verdict reads the steps since the job changed for good,
and nothing else cuts its window (noise, one spike, a change too recent to judge)."""

from __future__ import annotations

from auditor.analysis.changes import latest_change
from auditor.audit import Audit, judge
from tests.helpers.jobs import JobBuilder, balanced, with_rank

STARVED = {"data_wait": 0.2, "num_workers": 0, "worker_cpu": None}


def started(steps: int, *, jitter: float = 0.02, seed: int = 0) -> tuple[Audit, JobBuilder]:
    """Two balanced ranks (about 105 ms a step) for ``steps`` steps, fed to a live audit."""
    audit = Audit("j", window_s=10.0)
    job = JobBuilder(balanced(2), store=audit.store, jitter=jitter, seed=seed).run(steps)
    return audit, job


def kinds(audit: Audit, now: float) -> list[tuple[str, tuple[int, ...]]]:
    return [(f.kind, f.ranks) for f in audit.judge_live(now)[1].findings if f.severity != "info"]


def test_a_rank_starved_lately_is_judged_on_the_steps_since() -> None:
    audit, job = started(150)
    before = job.now  # the last balanced step's end
    job.run(10, with_rank(balanced(2), 1, **STARVED))
    window = audit.store.snapshot(job.now, 10.0, warmup_s=2.0)
    since = latest_change(window)
    assert since == before
    # The 10 s window is three quarters balanced steps: its medians show no starvation...
    assert "data_starvation" not in [f.kind for f in judge(window).findings]
    # ...the steps since the change do, on the starved rank.
    snap, verdict = audit.judge(job.now)
    assert snap.start == before and verdict.window == (before, job.now)
    assert ("data_starvation", (1,)) in kinds(audit, job.now)


def test_a_warning_on_the_steps_since_a_change_waits_for_a_second_verdict() -> None:
    """Seconds of steps are little evidence: a rank slow for a moment on a busy host would
    raise a warning for one second; one worth 1.37x (not marginal) still waits for the next
    verdict half a second on, on a window cut short, while the whole window's would show at
    once."""
    audit, job = started(150)
    job.run(14, with_rank(balanced(2), 1, data_wait=0.04, num_workers=0, worker_cpu=None))
    assert kinds(audit, job.now) == []
    assert audit.changed_at is not None
    assert kinds(audit, job.now + 0.2) == []  # a verdict too soon after is no confirmation
    assert ("data_starvation", (1,)) in kinds(audit, job.now + 0.5)
    found = [f for f in audit.findings if f.kind == "data_starvation"]
    assert found[0].severity == "warning" and found[0].predicted_speedup > 1.25


def test_too_few_steps_since_a_change_leave_the_window_whole() -> None:
    audit, job = started(150)
    job.run(5, with_rank(balanced(2), 1, **STARVED))  # the rules judge no rank on fewer than 8
    assert latest_change(audit.store.snapshot(job.now, 10.0)) is None
    snap, _ = audit.judge(job.now)
    assert snap.start == job.now - 10.0


def test_noise_and_a_spike_are_no_change() -> None:
    for seed in range(5):
        audit, job = started(150, jitter=0.15, seed=seed)
        assert latest_change(audit.store.snapshot(job.now, 10.0)) is None, seed
    audit, job = started(100)
    job.run(1, with_rank(balanced(2), 1, data_wait=1.0))  # one slow read, then as before
    job.run(30, balanced(2))
    assert latest_change(audit.store.snapshot(job.now, 10.0)) is None


def test_a_recovery_is_judged_on_the_steps_since() -> None:
    """The fix applied mid-run (or a stall that ended): the live verdict clears once the steps
    since say so, not when the slow steps leave the window."""
    audit, job = started(20)
    job.run(60, with_rank(balanced(2), 1, **STARVED))
    assert ("data_starvation", (1,)) in kinds(audit, job.now)
    job.run(20, balanced(2))
    assert latest_change(audit.store.snapshot(job.now, 10.0)) is not None
    assert "data_starvation" not in [k for k, _ in kinds(audit, job.now)]


def test_a_whole_run_window_is_never_cut() -> None:
    """``window_s=None`` (a replay judged whole) keeps every step: the final verdict has its own
    reading of changes (``slowdown`` and the segment since)."""
    audit = Audit("j", window_s=None)
    job = JobBuilder(balanced(2), store=audit.store).run(150)
    job.run(10, with_rank(balanced(2), 1, **STARVED))
    snap, _ = audit.judge(job.now)
    assert snap.start < job.now - 15
