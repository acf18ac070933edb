"""The final verdict judges the run's latest steady segment as well as the whole run: a job that
turned slow late is never "balanced", and what the steps since the change show (a straggler the
whole run's medians hide) joins the verdict, marked with the step the segment starts at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.audit import Audit
from auditor.report.html import render_html
from auditor.report.terminal import render_verdict
from auditor.telemetry.recorded import read_recording
from tests.helpers.jobs import JobBuilder, balanced, with_rank

DATA = Path(__file__).resolve().parent / "data"


def _audit(fast: int, slow: int, world: int = 2) -> Audit:
    """``fast`` balanced steps, then ``slow`` steps with rank 1's forward 5x longer."""
    audit = Audit("test")
    job = JobBuilder(balanced(world), store=audit.store)
    job.run(fast)
    job.run(slow, with_rank(balanced(world), 1, forward=0.150))
    return audit


def test_the_steps_since_the_change_add_what_the_whole_run_misses() -> None:
    # Rank 1 turns slow for the last fifth of the steps: the whole run's medians are the
    # balanced steps', so only the segment since the change names it a compute straggler.
    audit = _audit(500, 120)
    whole = [
        (f.kind, f.ranks) for f in audit.judge_snapshot(audit.store.snapshot(1e12, None)).findings
    ]
    assert ("compute_straggler", (1,)) not in whole
    _, findings = audit.final()
    kinds = {(f.kind, f.ranks): f for f in findings}
    slow = kinds[("slowdown", (1,))]
    assert slow.facts.step == 500 and "since_step" not in slow.evidence
    straggler = kinds[("compute_straggler", (1,))]
    assert straggler.evidence["since_step"] == 500
    assert straggler.severity in ("warning", "critical")
    # One finding of a kind and ranks: each is listed once.
    assert len(findings) == len(kinds)


def test_a_job_that_turned_slow_in_its_last_third_is_not_balanced_in_any_report() -> None:
    audit = _audit(400, 100)
    report = audit.report(command=["train.py"], exit_code=0, duration_s=60.0)
    text = render_verdict(report)
    assert "balanced" not in text
    head = text.splitlines()[0]
    assert head.startswith("Verdict: rank 1 holds the job back"), head
    assert "since step 400" in text  # the findings of the latest segment say so
    doc = json.loads(json.dumps(report.to_dict()))
    marked = [f for f in doc["findings"] if f["evidence"].get("since_step") == 400]
    assert marked and all(1 in f["ranks"] for f in marked)
    assert any(f["kind"] == "slowdown" and f["ranks"] == [1] for f in doc["findings"])
    page = render_html(doc)
    assert "slowdown" in page and "since step 400" in page


def test_a_run_without_a_change_is_judged_once() -> None:
    audit = Audit("test")
    JobBuilder(balanced(2), store=audit.store).run(300)
    _, findings = audit.final()
    assert all("since_step" not in f.evidence for f in findings)
    assert [f for f in findings if f.severity != "info"] == []


def _starved_late(before: dict[str, float], after: dict[str, float]) -> Audit:
    """150 steps with ``before`` on every rank, then 150 with ``after`` on every rank and rank 1
    waiting 0.2 s a step for its data."""
    audit = Audit("test")
    job = JobBuilder(balanced(2, **before), store=audit.store)
    job.run(150)
    job.run(150, with_rank(balanced(2, **after), 1, data_wait=0.2, num_workers=0))
    return audit


def test_a_fault_that_came_with_the_change_promises_no_more_than_the_pace_before_it() -> None:
    # Before the change every rank's forward took 80 ms; since, 40 ms (the starved rank's peer
    # computes alone on the host). The loader's fix is judged on the fast steps, but it takes
    # the job back to the pace it kept before the fault at best.
    audit = _starved_late({"forward": 0.080}, {"forward": 0.040})
    _, findings = audit.final()
    by = {(f.kind, f.ranks): f for f in findings}
    slow = by[("slowdown", (1,))]
    starved = by[("data_starvation", (1,))]
    cap = slow.facts.pace_slowdown
    assert starved.predicted_speedup == cap
    assert starved.evidence["speedup_capped"]["model"] > cap * 1.1
    assert starved.evidence["speedup_capped"]["before_step"] == slow.facts.step
    # The range runs from the cap up to the model's figure (the pace before is measured too),
    # each end reaching out as far as the job's pace moved over the parts (the evidence's
    # spread is rounded to 3 places).
    model = starved.evidence["speedup_capped"]["model"]
    q = starved.evidence.get("pace_spread", 1.0)
    assert starved.predicted_range is not None
    lo, hi = starved.predicted_range
    assert lo <= cap / (q - 5e-4)
    assert hi == pytest.approx(model * q, rel=1e-3)
    assert all(x.speedup == cap for x in starved.fixes if x.speedup is not None)


def test_a_fault_the_steps_before_the_change_had_too_keeps_its_prediction() -> None:
    # Starved all along, and more so after the change: its fix may beat the earlier pace.
    audit = Audit("test")
    job = JobBuilder(with_rank(balanced(2), 1, data_wait=0.1, num_workers=0), store=audit.store)
    job.run(150)
    job.run(150, with_rank(balanced(2), 1, data_wait=0.3, num_workers=0))
    _, findings = audit.final()
    by = {(f.kind, f.ranks): f for f in findings}
    starved = by[("data_starvation", (1,))]
    assert "speedup_capped" not in starved.evidence
    assert starved.predicted_speedup > by[("slowdown", (1,))].facts.slowdown * 1.5


def test_the_pace_before_a_change_caps_by_time_per_step_not_by_the_median_step() -> None:
    # Every rank's forward turns 50 ms slower at step 300 (the machine slowed), and from there
    # rank 1 stalls 2 s every 20 steps. The median step rose by 1.48x, the time per step by
    # 2.39x: the stall's fix is capped by the latter (it leaves the machine's slowdown), so
    # its own model's figure stands.
    audit = Audit("test")
    job = JobBuilder(balanced(2), store=audit.store)
    job.run(300)
    before = (job.now - 1_000.0) / job.step
    t0, s0 = job.now, job.step
    slower = balanced(2, forward=0.080)
    for _ in range(15):
        job.run(19, slower)
        job.run(1, with_rank(slower, 1, forward=2.0))
    _, findings = audit.final()
    by = {(f.kind, f.ranks): f for f in findings}
    slow = by[("slowdown", ())]
    assert slow.facts.slowdown == pytest.approx(1.48, abs=0.03)
    assert slow.facts.pace_slowdown == pytest.approx(
        (job.now - t0) / (job.step - s0) / before, rel=0.02
    )
    stall = by[("stall", (1,))]
    assert "speedup_capped" not in stall.evidence
    # Back at the slower machine's pace without the stalls: 0.159 s a step from 0.252.
    assert stall.predicted_speedup == pytest.approx(0.2516 / 0.159, rel=0.05)


def test_a_slow_spell_shorter_than_a_lasting_change_is_not_judged_on_its_own() -> None:
    # Rank 1 slow for the last 3.6 s only (18 steps of about 0.2 s): shorter than slowdown's
    # min_lasting_s (5 s), so the steps since are no segment of their own; the slowdown is told.
    audit = Audit("test")
    job = JobBuilder(balanced(2), store=audit.store)
    job.run(500)
    change = job.now
    job.run(18, with_rank(balanced(2), 1, forward=0.150))
    assert 2.0 < job.now - change < 5.0
    _, findings = audit.final()
    assert ("slowdown", (1,)) in {(f.kind, f.ranks) for f in findings}
    assert all("since_step" not in f.evidence for f in findings), findings
    assert ("compute_straggler", (1,)) not in {(f.kind, f.ranks) for f in findings}


def test_a_balanced_job_on_a_busy_host_is_not_judged_on_its_last_second_and_a_half() -> None:
    # torchrun, gloo, 2 ranks of examples/train_ddp.py beside three busy loops on 2 cores
    # (tests/data/busy_host_tail): the host slowed every rank alike for the last 65 steps
    # (1.7 s), in which rank 0 happened to be descheduled more; judged alone, those steps
    # named it a compute straggler (a warning, "expect 1.3x").
    rec = read_recording(DATA / "busy_host_tail" / "recording.jsonl")
    audit = Audit(rec.job)
    audit.add(rec.batch)
    _, findings = audit.final()
    assert [(f.kind, f.ranks) for f in findings if f.severity != "info"] == []
    # The spell is told, as info (it lasted under 5 s), and nothing is judged on it alone.
    assert [f.facts.step for f in findings if f.kind == "slowdown"] == [925], findings
    assert all("since_step" not in f.evidence for f in findings), findings
