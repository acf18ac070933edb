"""CLI errors: one clear line on stderr and exit status 2, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from auditor.cli import main
from auditor.config import RUN_OPTIONS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "nothing to run"),
        (["run", "--"], "nothing to run"),
        (["run", "--", "torchrun", "--nproc_per_node=2", "missing_script.py"], "script not found"),
        (["run", "--", "no-such-launcher-xyz", "train.py"], "command not found"),
        (["frobnicate"], "invalid choice"),
        ([], "missing command"),
        (["run", "--metrics-port", "99999", "--", "true"], "--metrics-port"),
        (["run", "--window", "-3", "--", "true"], "--window"),
        (["run", "--set", "data_starvation", "--", "true"], "--set"),
        (["run", "--bogus", "--", "true"], "unrecognized arguments"),
        (["run", "--address", "127.0.0.1:1", "--", "true"], "cannot reach the Ray cluster"),
        (["run", "--address", "nohostport", "--", "true"], "--address"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("auditor: error: ") and message in err


def test_environment_twins_are_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUDITOR_METRICS_PORT", "not-a-port")
    assert main(["run", "--", "true"]) == 2
    assert "AUDITOR_METRICS_PORT" in capsys.readouterr().err


def test_every_option_has_an_environment_twin() -> None:
    envs = [o.env for o in RUN_OPTIONS]
    assert len(set(envs)) == len(envs)
    assert all(e.startswith("AUDITOR_") for e in envs)


def test_console_script_runs_a_plain_command(tmp_path: Path) -> None:
    """The installed entry point: exit code comes through, with the in-process agent."""
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "run", "--no-ray", "--quiet", "--report", str(report),
         "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3
    assert report.exists()


def test_probe_path_prints_the_boot_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe-path"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert (path / "sitecustomize.py").is_file()
