"""``auditor run`` without traps, run for real (torchrun, gloo, 2 ranks, the in-process agent):
``--fail-on`` gates on the verdict, ``--json -`` keeps stdout for the JSON alone, and a rank
whose probe cannot attach says why in the live output and in the report."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import base_env, run_auditor, torchrun

pytestmark = pytest.mark.e2e

FAST = ["--no-ray", "--quiet"]


@pytest.mark.parametrize(
    ("script", "code"), [("starved_rank.py", 3), ("train_ddp.py", 0)], ids=["starved", "balanced"]
)
def test_fail_on_critical_gates_on_the_verdict(script: str, code: int, tmp_path: Path) -> None:
    run = run_auditor(
        [*FAST, "--fail-on", "critical"], torchrun(script, "--seconds", "5"), tmp=tmp_path
    )
    assert run.report is not None
    severities = [(f["kind"], f["severity"]) for f in run.report["findings"]]
    assert run.returncode == code, (severities, run.stderr[-2000:])
    assert run.report["job"]["exit_code"] == 0  # the job itself succeeded either way


def test_fail_on_keeps_a_failed_jobs_own_code(tmp_path: Path) -> None:
    env = {**base_env(), "AUDITOR_FAIL_ON": "warning"}
    run = run_auditor(FAST, [sys.executable, "-c", "raise SystemExit(5)"], tmp=tmp_path, env=env)
    assert run.returncode == 5, run.stderr


def test_json_dash_keeps_stdout_for_the_json(tmp_path: Path) -> None:
    job = [sys.executable, "-c", "print('job says hi', flush=True)"]
    run = run_auditor([*FAST, "--json", "-"], job, tmp=tmp_path)
    assert run.returncode == 0, run.stderr
    verdict = json.loads(run.stdout)  # stdout holds the JSON and nothing else
    assert verdict["job"]["command"] == job
    assert "job says hi" in run.stderr
    # The verdict for people still comes, on stderr.
    assert "Verdict" in run.stderr


def test_json_file(tmp_path: Path) -> None:
    dest = tmp_path / "verdict.json"
    job = [sys.executable, "-c", "print('job says hi')"]
    run = run_auditor([*FAST, "--json", str(dest)], job, tmp=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "job says hi\n"  # the job's stdout, untouched
    assert json.loads(dest.read_text())["job"]["command"] == job


def _shadowing_module(tmp: Path, env: dict[str, str]) -> str:
    """The job's own ``auditor.py`` on its PYTHONPATH: the probe's package cannot be imported."""
    (tmp / "src").mkdir()
    (tmp / "src" / "auditor.py").write_text('"""The job\'s own module, named auditor."""\n')
    env["PYTHONPATH"] = str(tmp / "src")
    return "the job's own module"


def _bad_probe_setting(tmp: Path, env: dict[str, str]) -> str:
    """A probe setting with a wrong value: the probe's package imports, attaching fails."""
    env["AUDITOR_PROBE_MEMORY_EVERY"] = "often"
    return "AUDITOR_PROBE_MEMORY_EVERY='often' is not an integer"


@pytest.mark.parametrize("breaks", [_shadowing_module, _bad_probe_setting], ids=["shadow", "env"])
def test_a_probe_that_cannot_attach_says_why(
    breaks: Callable[[Path, dict[str, str]], str], tmp_path: Path
) -> None:
    env = base_env()
    reason = breaks(tmp_path, env)
    run = run_auditor(
        ["--no-ray"], torchrun("train_ddp.py", "--seconds", "2"), tmp=tmp_path, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.report is not None
    notes = [n for n in run.report["notes"] if n.startswith("probe not attached in rank 0, rank 1")]
    assert len(notes) == 1 and reason in notes[0], run.report["notes"]
    # As it happened, one line per rank, and in the verdict.
    for rank in (0, 1):
        line = next(ln for ln in run.stderr.splitlines() if f"rank {rank}: probe not" in ln)
        assert line.startswith("auditor: ") and reason in line
    assert "Note: probe not attached in rank 0, rank 1" in run.stderr
