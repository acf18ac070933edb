"""idle_device in words: who holds the idle GPU's memory and how to free it; for a GPU no rank
owns, the fix is said once, in the evidence; the speed-up model as the JSON report words it."""

from __future__ import annotations

import re
from dataclasses import replace

from auditor.analysis.rules import idle_device
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_idle_device import STRAY, cpu_rank_holding_gpu1, two_ranks_on_four_gpus

SPEEDUP_MODEL = "not predicted: nothing in the job waits for an idle GPU"


def test_a_stray_pid_is_named_and_its_fix_said_in_the_evidence() -> None:
    (f,) = idle_device.RULE(two_ranks_on_four_gpus(STRAY))
    words = phrase(f)
    assert words.fixes == {}
    assert words.summary == "PID 31337 holds 12.0 GiB on idle node0 GPU 2 (no rank of this job)"
    fix = words.notes["fix"]
    assert isinstance(fix, str)
    assert fix.startswith("free it: PID 31337 holds 12.0 GiB on idle node0 GPU 2")
    assert "`kill 31337`" in fix
    # The report's evidence: the figures, then the speed-up model and the fix, as always.
    evidence = ReportFinding.of(f).evidence
    assert list(evidence) == [*f.evidence, "speedup_model", "fix"]
    assert evidence["speedup_model"] == SPEEDUP_MODEL
    assert evidence["fix"] == fix


def test_processes_nvml_does_not_list() -> None:
    (f,) = idle_device.RULE(two_ranks_on_four_gpus(replace(STRAY, processes=())))
    assert phrase(f).summary.startswith("processes outside this job hold 12.0 GiB on idle")
    assert "`kill <pid>`" in str(phrase(f).notes["fix"])


def test_the_owning_rank_is_told_to_free_it() -> None:
    (f,) = idle_device.RULE(cpu_rank_holding_gpu1())
    words = phrase(f)
    assert words.fixes[1].startswith("free it: the process holds 2.0 GiB on node0 GPU 1")
    # Judged over the time its owner trained (start-up and teardown are not idleness).
    assert re.search(r"\(busy 0% over \d+ s of training\)", words.fixes[1])
    assert "torch.cuda.set_device(local_rank)" in words.fixes[1]
    assert words.fixes[1] == words.notes["fix"]
    assert words.summary == "rank 1 holds 2.0 GiB on idle node0 GPU 1"
    assert words.notes["speedup_model"] == SPEEDUP_MODEL


def test_the_recorded_idle_gpu_in_words() -> None:
    from tests.analysis.test_scenarios import load

    (f,) = idle_device.RULE(load("idle_allocated_gpu")[0])
    assert "`kill 39127`" in str(phrase(f).notes["fix"])
