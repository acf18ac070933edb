"""``auditor run --apply``: its forms, its environment twin, and its errors (one line, exit 2,
the job not started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.cli import build_parser, main
from auditor.cli.applying import parse_apply
from auditor.cli.run import run_config
from auditor.cluster.probing import probe_env
from auditor.configs import ApplyPlan, ConfigError
from auditor.probe.apply import ENV_APPLY, ENV_MATCH, RankPlan, read_plan
from auditor.report.json_report import write_report
from tests.report.test_applied import starved

TORCHRUN = ["torchrun", "--nproc_per_node=2", "train.py"]


@pytest.fixture
def before(tmp_path: Path) -> str:
    path = tmp_path / "before.json"
    write_report(path, starved())
    return str(path)


def config(argv: list[str], env: dict[str, str] | None = None) -> ApplyPlan | None:
    ns = build_parser().parse_args(["run", *argv])
    return run_config(ns, TORCHRUN, env or {}).apply_plan


def test_one_lever() -> None:
    plan = config(["--apply", "rank1.num_workers=7"])
    assert plan == ApplyPlan(levers={1: {"num_workers": 7}}, sources=("rank1.num_workers=7",))


def test_repeated_and_comma_separated() -> None:
    plan = config(
        [
            "--apply",
            "rank1.num_workers=7,rank1.pin_memory=true",
            "--apply",
            "rank0.prefetch_factor=4",
        ]
    )
    assert plan is not None
    assert plan.levers == {1: {"num_workers": 7, "pin_memory": True}, 0: {"prefetch_factor": 4}}
    assert plan.match == {}


def test_the_environment_twin() -> None:
    plan = config([], {"AUDITOR_APPLY": "rank1.num_workers=3"})
    assert plan is not None and plan.levers == {1: {"num_workers": 3}}
    assert config([]) is None


def test_a_report(before: str) -> None:
    plan = config(["--apply", before])
    assert plan is not None
    assert plan.levers == {1: {"num_workers": 7, "pin_memory": True}}
    assert plan.match[1]["num_workers"] == 0 and plan.match[1]["dataset"] == "SyntheticImages"
    assert plan.not_applied == ((1, "batch_size", 32, 64),)
    assert plan.sources == (before,)


def test_a_lever_after_a_report_wins(before: str) -> None:
    plan = config(["--apply", f"{before},rank1.num_workers=2"])
    assert plan is not None and plan.levers == {1: {"num_workers": 2, "pin_memory": True}}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("rank1.num_worker=7", "--apply: unknown lever 'num_worker' (loader levers: "),
        ("rank1.batch_size=64", "--apply: batch_size needs a change to the script or machine"),
        ("rank2.num_workers=7", "rank 2 is out of range (the command starts 2 ranks: 0 to 1)"),
        ("rank1.num_workers=seven", "rank1.num_workers=seven: num_workers takes an integer"),
        ("rank1.pin_memory=2", "pin_memory takes true or false, got '2'"),
        ("rankx.num_workers=7", "expected REPORT.json or rankN.lever=value"),
        ("num_workers=7", "expected REPORT.json or rankN.lever=value"),
        ("missing.json", "--apply: no such report: missing.json"),
    ],
)
def test_bad_input_is_one_clear_line(value: str, error: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config(["--apply", value])
    assert error in str(exc.value)
    assert str(exc.value).startswith("--apply: ") and "\n" not in str(exc.value)


def test_not_a_report(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="not an auditor report"):
        config(["--apply", str(path)])
    path.write_text("{broken")
    with pytest.raises(ConfigError, match="invalid JSON"):
        config(["--apply", str(path)])


def test_a_reports_rank_out_of_range(before: str) -> None:
    with pytest.raises(ConfigError, match="a fix on rank 1\\): rank 1 is out of range"):
        parse_apply(before, ["torchrun", "--nproc_per_node=1", "train.py"])
    # A command that does not say how many ranks it starts: no bound.
    assert parse_apply("rank5.num_workers=1", ["python", "train.py"]) is not None


def test_the_twin_is_named_in_its_errors() -> None:
    with pytest.raises(ConfigError, match=r"^AUDITOR_APPLY: unknown lever"):
        config([], {"AUDITOR_APPLY": "rank1.workers=2"})


def test_the_job_is_not_started(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "started"
    code = main(["run", "--apply", "rank1.num_workers=x", "--", "touch", str(marker)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("auditor: error: --apply:")
    assert not marker.exists()


def test_the_plan_reaches_the_ranks_environment(before: str) -> None:
    plan = config(["--apply", before])
    env = probe_env({ENV_APPLY: "stale"}, sink="/s", job="j", apply=plan)
    assert json.loads(env[ENV_APPLY]) == {"1": {"num_workers": 7, "pin_memory": True}}
    assert read_plan(env)[1] == RankPlan(
        {"num_workers": 7, "pin_memory": True}, json.loads(env[ENV_MATCH])["1"]
    )
    # Without a plan, one inherited from the caller's environment does not apply.
    bare = probe_env({ENV_APPLY: "stale", ENV_MATCH: "{}"}, sink="/s", job="j")
    assert ENV_APPLY not in bare and ENV_MATCH not in bare
