"""The JSON report: exact schema, JSON round trip, atomic write, validation on load."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from auditor.analysis import SampleStore, analyze
from auditor.analysis.findings import Finding
from auditor.report.json_report import (
    JOB_KEYS,
    MEMORY_KEYS,
    RANK_KEYS,
    SCHEMA,
    build_report,
    load_report,
    write_report,
)
from auditor.report.model import ReportFinding
from auditor.samples import OFF_THREAD_COLLECTIVES, Batch, RankInfo, StepSample
from tests.helpers.reports import HOST, T0, make_store, snapshot_of, starved_report


def test_report_has_exact_schema_keys() -> None:
    _, findings, report = starved_report()
    assert list(report) == ["schema", "generated_at", "job", "ranks", "findings", "notes"]
    assert report["schema"] == SCHEMA == "auditor.report/v2"
    assert set(report["job"]) == set(JOB_KEYS)
    assert len(report["ranks"]) == 2
    for entry in report["ranks"]:
        assert set(entry) == set(RANK_KEYS)
        assert set(entry["memory"]) == set(MEMORY_KEYS)
        assert set(entry["loader"]) == {
            "num_workers",
            "pin_memory",
            "prefetch_factor",
            "persistent_workers",
            "batch_size",
            "drop_last",
            "sampler",
            "dataset",
        }
    assert report["findings"] == [ReportFinding.of(f).to_dict() for f in findings]
    generated = datetime.strptime(report["generated_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert (
        abs(generated.replace(tzinfo=timezone.utc) - datetime.now(timezone.utc)).total_seconds()
        < 60
    )


def test_report_values_for_starved_rank() -> None:
    _, findings, report = starved_report()
    job = report["job"]
    assert job["name"] == "demo-job"
    assert job["command"] == ["torchrun", "--nproc_per_node=2", "train.py", "--epochs", "1"]
    assert job["world_size"] == 2
    assert job["parallel_mode"] == "ddp"
    assert job["duration_s"] == 12.346
    assert job["interrupted"] is False
    assert job["hosts"] == {HOST: [0, 1]}

    r0, r1 = report["ranks"]
    assert [r0["rank"], r1["rank"]] == [0, 1]
    assert r1["steps"] == r1["window_steps"] == 20
    assert r1["step_s"] == pytest.approx(0.1)
    assert r1["data_wait_s"] == pytest.approx(0.08)
    assert r1["data_wait_ratio"] == pytest.approx(0.8)
    assert r0["collective_wait_s"] == pytest.approx(0.0795)
    assert r1["compute_s"] == pytest.approx(0.001 + 0.006 + 0.010 + 0.003)
    assert r1["batch_size"] == 32 and isinstance(r1["batch_size"], int)
    assert r1["samples_per_s"] == pytest.approx(320.0)
    assert r1["worker_cpu"] == pytest.approx(0.8)
    assert r1["workers"] == 2
    assert r1["main_cpu"] == pytest.approx(0.95)
    assert r1["memory"]["rss_bytes"] == 2_000_000_001
    assert r1["memory"]["peak_bytes"] == 1_200_000_019  # the window's maximum
    assert r1["pid"] == 4001 and r1["device"] == "cuda:1"
    assert r1["ended"] is False and r1["unmeasured"] == []
    # seconds are rounded to at most 6 decimals
    for entry in report["ranks"]:
        for key in ("step_s", "data_wait_s", "compute_s", "collective_wait_s"):
            assert entry[key] == round(entry[key], 6)

    starvation = [f for f in report["findings"] if f["kind"] == "data_starvation"]
    assert starvation and starvation[0]["ranks"] == [1]
    assert findings[0].kind == "data_starvation"


def test_report_round_trips_through_json() -> None:
    _, _, report = starved_report()
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text) == report


def test_missing_values_are_null_not_zero() -> None:
    snap = snapshot_of(
        make_store(with_cpu=False, collective=False, unmeasured=("collective_wait",))
    )
    report = build_report(
        command=["python", "train.py"],
        exit_code=None,
        duration_s=3.0,
        snapshot=snap,
        findings=analyze(snap),
    )
    assert [entry["rank"] for entry in report["ranks"]] == [0, 1]
    for entry in report["ranks"]:
        assert entry["collective_wait_s"] is None
        assert entry["main_cpu"] is None
        assert entry["worker_cpu"] is None
        assert entry["workers"] is None
        assert entry["unmeasured"] == ["collective_wait"]
    assert report["job"]["exit_code"] is None
    json.dumps(report, allow_nan=False)


def _ops_store() -> SampleStore:
    """Two ranks: rank 0 names its collectives (an all_gather_object in 7 steps of 10), rank 1
    is an older probe that names none and also called collectives off its training thread."""
    store = SampleStore("ops-job")
    store.add(
        Batch(
            infos=(
                RankInfo(rank=0, world_size=2, host=HOST, job="ops-job"),
                RankInfo(
                    rank=1,
                    world_size=2,
                    host=HOST,
                    job="ops-job",
                    unmeasured=(OFF_THREAD_COLLECTIVES,),
                    off_thread_collectives=7,
                ),
            )
        )
    )
    for i in range(10):
        gather = 0.010 if i >= 3 else 0.0
        ops = {"ddp_allreduce": 0.040, **({"all_gather_object": gather} if gather else {})}
        rows = (
            StepSample(
                rank=0,
                step=i,
                time=T0 + 0.1 * (i + 1),
                step_s=0.1,
                forward_s=0.02,
                collective_wait_s=sum(ops.values()),
                collective_ops=ops,
            ),
            StepSample(
                rank=1,
                step=i,
                time=T0 + 0.1 * (i + 1),
                step_s=0.1,
                forward_s=0.06,
                collective_wait_s=0.001,
            ),
        )
        store.add(Batch(steps=rows))
    return store


def test_collective_wait_by_operation_and_off_thread_collectives_per_rank() -> None:
    snap = snapshot_of(_ops_store())
    report = build_report(
        command=["python", "train.py"], exit_code=0, duration_s=1.0, snapshot=snap, findings=[]
    )
    r0, r1 = report["ranks"]
    # Each op's median wait per step (a step without the op counts 0 there), in seconds.
    assert r0["collective_ops"] == {
        "all_gather_object": pytest.approx(0.010),
        "ddp_allreduce": pytest.approx(0.040),
    }
    assert r0["unmeasured"] == [] and r0["off_thread_collectives"] == 0
    assert r1["collective_ops"] is None  # named none: not measured, not {}
    assert r1["unmeasured"] == ["collectives off the training thread"]
    assert r1["off_thread_collectives"] == 7
    json.dumps(report, allow_nan=False)


def test_rank_without_steps_has_null_timings() -> None:
    store = make_store(steps=0)
    report = build_report(
        command=["python", "train.py"],
        exit_code=1,
        duration_s=0.5,
        snapshot=store.snapshot(T0, None),
        findings=[],
    )
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for entry in report["ranks"]:
        assert entry["steps"] == entry["window_steps"] == 0
        for key in ("step_s", "data_wait_s", "compute_s", "data_wait_ratio", "busy_ratio"):
            assert entry[key] is None, key
        assert entry["batch_size"] is None and entry["samples_per_s"] is None


def test_empty_snapshot_gives_empty_report() -> None:
    snap = SampleStore("crashed").snapshot(T0, None)
    findings = analyze(snap)
    report = build_report(
        command=["python", "boom.py"],
        exit_code=2,
        duration_s=0.25,
        snapshot=snap,
        findings=findings,
        interrupted=True,
    )
    assert report["ranks"] == [] and report["findings"] == []
    assert report["job"]["world_size"] is None
    assert report["job"]["hosts"] == {}
    assert report["job"]["exit_code"] == 2
    assert report["job"]["interrupted"] is True
    assert report["job"]["name"] == "crashed"
    json.dumps(report, allow_nan=False)


def test_non_finite_numbers_become_null() -> None:
    snap = snapshot_of(make_store())
    odd = Finding(
        kind="memory_headroom",
        severity="info",
        ranks=(0,),
        evidence={"ratio": float("nan"), "pair": (1, float("inf"))},
    )
    report = build_report(command=["x"], exit_code=0, duration_s=1.0, snapshot=snap, findings=[odd])
    assert report["findings"][0]["evidence"] == {"ratio": None, "pair": [1, None]}
    json.dumps(report, allow_nan=False)


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    _, _, report = starved_report()
    target = tmp_path / "deep" / "er" / "report.json"
    write_report(target, report)
    assert load_report(target) == report
    text = target.read_text()
    assert text.startswith('{\n  "schema": "auditor.report/v2"')  # indent=2
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]  # no temp left
    # overwriting replaces the file whole
    report2 = dict(report, notes=["second"])
    write_report(str(target), report2)
    assert load_report(str(target))["notes"] == ["second"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]


def test_write_failure_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    _, _, report = starved_report()
    write_report(target, report)
    with pytest.raises(ValueError):
        write_report(target, {"schema": SCHEMA, "bad": float("nan")})
    assert load_report(target) == report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON"),
        ("", "invalid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"job": {}}', "no 'schema' key"),
        ('{"schema": "auditor.report/v0", "job": {}}', "'auditor.report/v0'"),
        (
            '{"schema": "auditor.report/v1", "job": [], "ranks": [], "findings": [], "notes": []}',
            "'job' must be a dict",
        ),
        (
            '{"schema": "auditor.report/v1", "job": {}, "ranks": [{}], "findings": [],'
            ' "notes": []}',
            "ranks[0]",
        ),
    ],
)
def test_load_report_rejects_malformed(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"not an auditor report|malformed") as err:
        load_report(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_load_report_rejects_binary(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="not an auditor report"):
        load_report(path)


def test_load_report_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_report(tmp_path / "nope.json")
