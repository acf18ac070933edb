"""PromQL answers -> Snapshot: exact reconstruction from hand-written answers in the shape
Prometheus returns for :func:`queries` (labels as the node endpoints export them)."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from auditor.analysis import analyze
from auditor.analysis.devices import device_stats
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.analysis.stats import rank_stats, rank_stats_from_columns
from auditor.metrics import catalog as C
from auditor.metrics import dcgm as D
from auditor.metrics.query import Series
from auditor.report.phrasing import phrase
from auditor.samples import ProcessCpu, RankInfo, StepSample
from auditor.service.promsnapshot import build_snapshots, queries, running_jobs, sub_key
from tests.helpers import servejob
from tests.helpers.tools import require_tool

NOW = 1_800_000_000.0
WINDOW = 60.0
JOB = "train"
NODE = "node-a"


def put(answers: dict[str, list[Series]], key: str, labels: dict[str, str], value: float) -> None:
    answers.setdefault(key, []).append(Series(labels, ((NOW, value),)))


def rank_answers(
    answers: dict[str, list[Series]],
    rank: int,
    *,
    job: str = JOB,
    node: str = NODE,
    steps: float = 100.0,
    step_s: float = 0.1,
    phases: dict[str, float] | None = None,
    up: float = 1.0,
    seen: float = NOW - 1,
    micro_batches: float | None = None,
) -> None:
    """One rank as its endpoint exports it, aggregated over the window (``micro_batches``: the
    DataLoader batches per step; None: an endpoint that does not export them)."""
    key = {"auditor_job": job, "rank": str(rank)}
    full = {**key, "node": node, "local_rank": str(rank)}
    put(answers, "rank_info", {**full, "device": f"cuda:{rank}", "parallel_mode": "ddp",
                               "world_size": "2"}, 1)  # fmt: skip
    put(answers, "loader_info", {**full, "pin_memory": "false", "persistent_workers": "false",
                                 "prefetch_factor": "2", "batch_size": "32"}, 1)  # fmt: skip
    put(answers, "config_workers", key, 2)
    put(answers, "rank_up", key, up)
    put(answers, "rank_seen", key, seen)
    put(answers, "steps", key, steps)
    put(answers, "step_seconds", key, steps * step_s)
    for phase, per_step in (phases or {}).items():
        put(answers, sub_key("phase_seconds", phase), key, steps * per_step)
    put(answers, "samples", key, steps * 32)
    if micro_batches is not None:
        put(answers, "micro_batches", key, steps * micro_batches)
    for memory, value in (("rss", 3e9), ("peak", 20e9)):
        put(answers, sub_key("memory", memory), key, value)
    put(answers, sub_key("cpu", "main"), key, 1.0)
    put(answers, sub_key("cpu", "workers"), key, 1.6)
    put(answers, "workers", key, 2)


def gpu_answers(
    answers: dict[str, list[Series]],
    uuid: str,
    *,
    index: int,
    job: str = "",
    rank: str = "",
    node: str = NODE,
    samples: float = 12,
    util: float = 0.9,
    reasons: dict[str, float] | None = None,
) -> None:
    labels = {"node": node, "gpu": str(index), "uuid": uuid, "model": "NVIDIA H200",
              "auditor_job": job, "rank": rank}  # fmt: skip
    put(answers, "gpu_up", labels, 1)
    u = {"uuid": uuid}
    for key, value in (
        ("gpu_samples", samples),
        ("gpu_span", 54),
        ("gpu_lost", 0),
        ("gpu_util", util),
        ("gpu_mem_used", 40e9),
        ("gpu_mem_used_max", 41e9),
        ("gpu_mem_total", 140e9),
        ("gpu_mem_trend", 1e6),
        ("gpu_mem_recent", 0.0),
        ("gpu_sm_clock", 1.2e9),
        ("gpu_sm_clock_max", 1.98e9),
        ("gpu_pcie_gen", 4),
        ("gpu_pcie_gen_max", 5),
    ):
        put(answers, key, u, value)
    if reasons is not None:
        put(answers, "gpu_throttle_read", u, len(C.THROTTLE_REASONS))
        for reason, share in reasons.items():
            put(answers, "gpu_throttle", {**u, "reason": reason}, share)


# Exclusive phases: backward holds no collective wait.
STARVED = {"data_wait": 0.08, "forward": 0.01, "backward": 0.01, "collective_wait": 0.001}
WAITING = {"data_wait": 0.001, "forward": 0.01, "backward": 0.01, "collective_wait": 0.08}


def two_ranks() -> dict[str, list[Series]]:
    answers: dict[str, list[Series]] = {}
    rank_answers(answers, 0, phases=WAITING)
    rank_answers(answers, 1, phases=STARVED)
    node = {"auditor_job": JOB, "node": NODE}
    for key, value in (
        ("node_cores", 16),
        ("node_busy", 4),
        ("node_load", 3),
        ("node_samples", 12),
    ):
        put(answers, key, node, value)
    return answers


def test_mean_step_of_the_window() -> None:
    snap = build_snapshots(two_ranks(), NOW, WINDOW)[JOB]
    assert (snap.start, snap.end) == (NOW - WINDOW, NOW)
    view = snap.ranks[1]
    (step,) = view.steps
    assert step.count == 100 and step.time == NOW
    assert step.step_s == pytest.approx(0.1)
    assert step.data_wait_s == pytest.approx(0.08)
    assert step.collective_wait_s == pytest.approx(0.001)
    assert step.h2d_s == 0.0 and step.optimizer_s == 0.0  # exported as absent: none measured
    assert step.batch_size == 32
    assert step.rss_bytes == 3_000_000_000 and step.mem_peak_bytes == 20_000_000_000
    assert step.mem_allocated_bytes is None  # not exported: unknown, not zero
    assert snap.total_steps == {}  # the run's totals are the report's: serve does not ask
    assert snap.stats[1].steps == 100  # the rules' min_steps see the steps it stands for
    (node,) = snap.nodes
    assert (node.host, node.cores, node.busy_cores, node.load1, node.samples) == (
        NODE,
        16,
        4,
        3,
        12,
    )


def test_unmeasured_collective_wait_stays_unknown() -> None:
    answers: dict[str, list[Series]] = {}
    rank_answers(answers, 0, phases={"data_wait": 0.01, "forward": 0.02, "backward": 0.05})
    (step,) = build_snapshots(answers, NOW, WINDOW)[JOB].ranks[0].steps
    assert step.collective_wait_s is None


def test_rank_identity_loader_and_cpu() -> None:
    view = build_snapshots(two_ranks(), NOW, WINDOW)[JOB].ranks[0]
    info = view.info
    assert (info.rank, info.world_size, info.host, info.device, info.parallel_mode) == (
        0,
        2,
        NODE,
        "cuda:0",
        "ddp",
    )
    assert info.loader is not None
    assert (info.loader.num_workers, info.loader.pin_memory, info.loader.prefetch_factor) == (
        2,
        False,
        2,
    )
    assert info.loader.batch_size == 32 and info.loader.persistent_workers is False
    (cpu,) = view.cpu
    assert cpu.main_cpu == 1.0 and cpu.worker_cpu == (0.8, 0.8)


def test_a_rank_owning_several_gpus_lists_them_in_index_order() -> None:
    """A DataParallel rank drives every GPU of its node: their series all name it, in whatever
    order Prometheus lists them."""
    answers = two_ranks()
    for uuid, index in (("GPU-c", 2), ("GPU-a", 0), ("GPU-d", 3), ("GPU-b", 1)):
        gpu_answers(answers, uuid, index=index, job=JOB, rank="0")
    info = build_snapshots(answers, NOW, WINDOW)[JOB].ranks[0].info
    assert info.devices == (0, 1, 2, 3)
    assert info.device_uuids == ("GPU-a", "GPU-b", "GPU-c", "GPU-d")


def test_gradient_accumulation_reaches_the_batch_advice() -> None:
    """A rank training 4 micro-batches of 8 a step (32 samples): serve reads the micro-batches
    from their counter and advises the batch the user sets, as the live path does; without
    the counter (an older endpoint) a step is one micro-batch."""
    answers: dict[str, list[Series]] = {}
    slow = {"data_wait": 0.001, "forward": 0.09, "backward": 0.02, "collective_wait": 0.001}
    for rank in range(4):
        phases = slow if rank == 2 else {**slow, "forward": 0.03, "collective_wait": 0.061}
        rank_answers(answers, rank, phases=phases, step_s=0.112, micro_batches=4)
    snap = build_snapshots(answers, NOW, WINDOW)[JOB]
    assert {s.micro_batches for s in snap.stats.values()} == {4.0}
    assert snap.stats[2].micro_batch_size == 8
    assert {step.micro_batches for v in snap.ranks for step in v.steps} == {4}
    _built_alike(snap)
    (straggler,) = [f for f in analyze(snap) if f.kind == "compute_straggler"]
    assert straggler.ranks == (2,)
    fix = phrase(straggler).fixes[2]
    assert "batch_size 8 -> " in fix and "(per micro-batch; 4 accumulated per step" in fix, fix

    del answers["micro_batches"]
    assert {s.micro_batches for s in build_snapshots(answers, NOW, WINDOW)[JOB].stats.values()} == {
        1.0
    }


def test_no_step_in_the_window_gives_no_sample() -> None:
    answers = two_ranks()
    answers["steps"] = [s for s in answers["steps"] if s.labels["rank"] != "1"]
    answers["steps"].append(Series({"auditor_job": JOB, "rank": "1"}, ((NOW, 0.0),)))
    snap = build_snapshots(answers, NOW, WINDOW)[JOB]
    assert snap.ranks[1].steps == ()


def test_nan_answers_are_ignored() -> None:
    answers = two_ranks()
    put(answers, sub_key("memory", "allocated"), {"auditor_job": JOB, "rank": "0"}, math.nan)
    (step,) = build_snapshots(answers, NOW, WINDOW)[JOB].ranks[0].steps
    assert step.mem_allocated_bytes is None


def test_gpus_owned_by_labels_and_kept_per_job() -> None:
    answers = two_ranks()
    gpu_answers(answers, "GPU-a", index=0, job=JOB, rank="0")
    gpu_answers(answers, "GPU-b", index=1, job=JOB, rank="1", reasons={"sw_thermal_slowdown": 0.6})
    gpu_answers(answers, "GPU-free", index=2)  # nobody's, on the job's node: shown
    gpu_answers(answers, "GPU-far", index=0, node="node-b")  # nobody's, elsewhere: not ours
    gpu_answers(answers, "GPU-other", index=3, job="other", rank="0")
    gpu_answers(answers, "GPU-silent", index=4, samples=0)  # never answered: left out
    rank_answers(answers, 0, job="other")
    snaps = build_snapshots(answers, NOW, WINDOW)
    snap = snaps[JOB]
    assert snap.ranks[0].info.device_uuids == ("GPU-a",) and snap.ranks[0].info.devices == (0,)
    assert snap.ranks[1].info.device_uuids == ("GPU-b",)
    assert {g.uuid for g in snap.gpus} == {"GPU-a", "GPU-b", "GPU-free"}
    assert {g.uuid for g in snaps["other"].gpus} == {"GPU-other", "GPU-free"}
    stats = device_stats(snap)
    b = stats["GPU-b"]
    assert b.samples == 12 and b.span_s == 54 and b.lost is False
    assert b.sm_clock_mhz == pytest.approx(1200) and b.sm_clock_ratio == pytest.approx(1.2 / 1.98)
    assert b.mem_ratio == pytest.approx(40 / 140) and b.mem_used_max_bytes == 41_000_000_000
    assert b.mem_trend_bytes_per_s == 1e6 and b.pcie_gen == 4 and b.pcie_degraded is True
    assert b.throttle_share == 0.6 and b.throttle_reasons == ("sw_thermal_slowdown",)
    # Reasons read but none active: 0, not unknown; no reasons read at all: unknown.
    gpu_answers(answers, "GPU-c", index=5, reasons={})
    again = device_stats(build_snapshots(answers, NOW, WINDOW)[JOB])
    assert again["GPU-c"].throttle_share == 0.0
    assert stats["GPU-a"].throttle_share is None


def test_running_jobs() -> None:
    answers = two_ranks()
    rank_answers(answers, 0, job="stale", seen=NOW - 300)
    rank_answers(answers, 0, job="ended", up=0)
    jobs = running_jobs(answers, NOW, stale_after_s=30)
    assert {j for j, w in jobs.items() if w.running} == {JOB}
    assert set(jobs) == {JOB, "stale", "ended"}
    snaps = build_snapshots(answers, NOW, WINDOW, jobs=[JOB])
    assert set(snaps) == {JOB}
    assert build_snapshots(answers, NOW, WINDOW)["ended"].ranks[0].ended is True


def test_the_same_rules_judge_it() -> None:
    findings = analyze(build_snapshots(two_ranks(), NOW, WINDOW)[JOB])
    starved = [f for f in findings if f.kind == "data_starvation"]
    assert [f.ranks for f in starved] == [(1,)]
    assert "num_workers 2 ->" in phrase(starved[0]).fixes[1]
    assert all(0 not in f.ranks for f in findings if f.severity != "info")


def test_every_query_names_catalog_metrics_and_parses(tmp_path: Path) -> None:
    exprs = queries(WINDOW)
    # The ranks', nodes' and GPUs' queries are all there (a lost one would be checked by nobody).
    assert {
        "rank_info",
        "steps",
        sub_key("phase_seconds", "forward"),
        "node_cores",
        "gpu_up",
    } <= set(exprs)
    for key, expr in exprs.items():
        # auditor_job is the training job's label, not a metric.
        names = set(re.findall(r"\bauditor_[a-z0-9_]+", expr)) - {C.JOB_LABEL}
        # dcgm-exporter's series (auditor.metrics.dcgm) where serve reads GPUs from it.
        dcgm = set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+", expr))
        assert names | dcgm and names <= set(C.BY_NAME), (key, names)
        assert dcgm <= set(D.BY_NAME) | set(D.THROTTLE_FIELDS), (key, dcgm)
    promtool = require_tool("promtool")
    rules = {
        "groups": [
            {
                "name": "serve-queries",
                "rules": [{"record": f"check:{key}", "expr": e} for key, e in exprs.items()],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_starting_ranks_phases_add_up_to_its_step_in_prometheus(tmp_path: Path) -> None:
    """The counters of a rank that starts inside the window, judged by Prometheus itself
    (``promtool test rules``). Its first scrape follows a first step that waited for its peer
    (1.25 s, 1 s of it at the all-reduce); then a step a second, 0.9375 s of it waiting. Each
    series' own extrapolation (``increase()``) made that wait 6.625 s against 6.5 s of steps, and
    the rank that only waits had no time of its own; the growth between the window's scrapes
    is exact. A counter reset (the endpoint restarted) counts from its lowest value."""
    exprs = queries(30.0)
    labels = f'{{{C.JOB_LABEL}="{JOB}",rank="0"}}'
    wait = sub_key("phase_seconds", "collective_wait")
    phase = f'{C.RANK_PHASE_SECONDS_TOTAL.name}{{{C.JOB_LABEL}="{JOB}",rank="0",phase='
    series = {
        f"{C.RANK_STEPS_TOTAL.name}{labels}": "_x10 1+1x6",
        f"{C.RANK_STEP_SECONDS_TOTAL.name}{labels}": "_x10 1.25+1x6",
        f'{phase}"collective_wait"}}': "_x10 1+0.9375x6",
        # The endpoint restarted at 14 s.
        f'{phase}"forward"}}': "_x10 0.5 0.5625 0.625 0.6875 0 0.0625 0.125",
    }
    cases = {"steps": 6, "step_seconds": 6, wait: 5.625, sub_key("phase_seconds", "forward"): 0.125}
    unit = {
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": exprs[key],
                        "eval_time": "16s",
                        "exp_samples": [{"labels": labels, "value": value}],
                    }
                    for key, value in cases.items()
                ],
            }
        ],
    }
    path = tmp_path / "growth_test.yml"
    path.write_text(yaml.safe_dump(unit))
    promtool = require_tool("promtool")
    out = subprocess.run(
        [promtool, "test", "rules", path.name], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_fleet_agents_node_cpu_counts_for_every_job_there() -> None:
    """Node CPU exported by a fleet agent has job="": it stands for each job with ranks on that
    node, unless the job's own endpoint exported the node."""
    answers = two_ranks()
    rank_answers(answers, 0, job="other", node="node-b")
    for node, cores in ((NODE, 99), ("node-b", 32)):
        for key, value in (("node_cores", cores), ("node_busy", 4), ("node_samples", 12)):
            put(answers, key, {"auditor_job": "", "node": node}, value)
    snaps = build_snapshots(answers, NOW, WINDOW)
    assert [(n.host, n.cores) for n in snaps[JOB].nodes] == [(NODE, 16)]  # its own endpoint's
    assert [(n.host, n.cores) for n in snaps["other"].nodes] == [("node-b", 32)]


def _built_alike(snap: Snapshot) -> None:
    """The rebuild's shortcuts change nothing: each rank's statistics are what reducing its
    view gives, and every object is the one its constructor builds from the same fields."""
    assert snap.ranks
    for view in snap.ranks:
        reduced = rank_stats(view)
        assert vars(snap.stats[view.info.rank]) == vars(reduced), view.info.rank
        for obj in (view, view.info, *view.steps, *view.cpu, snap.stats[view.info.rank]):
            assert vars(dataclasses.replace(obj)) == vars(obj), obj
    for gpu in snap.gpus:
        assert vars(dataclasses.replace(gpu)) == vars(gpu), gpu


def test_stats_and_objects_equal_the_reductions_and_constructors() -> None:
    answers = two_ranks()
    gpu_answers(answers, "GPU-a", index=0, job=JOB, rank="0")
    gpu_answers(answers, "GPU-b", index=1, job=JOB, rank="1", reasons={"sw_thermal_slowdown": 0.6})
    # A rank with no step in the window, one with no CPU series, NaN and unmeasured figures.
    rank_answers(answers, 2, steps=0.0)
    rank_answers(answers, 3, phases=WAITING)
    for process in C.CPU_PROCESSES:
        key = sub_key("cpu", process)
        answers[key] = [s for s in answers[key] if s.labels["rank"] != "3"]
    put(answers, sub_key("memory", "allocated"), {"auditor_job": JOB, "rank": "0"}, math.nan)
    _built_alike(build_snapshots(answers, NOW, WINDOW)[JOB])
    big = servejob.answers(64, scrape_s=15.0, now=NOW)
    _built_alike(build_snapshots(big, NOW, servejob.WINDOW_S)[servejob.JOB])


def test_column_statistics_follow_the_reductions_rules() -> None:
    """``rank_stats_from_columns`` on its own: a rank without steps has an empty window's
    figures whatever its step columns say, one never sampled no CPU figures; counts and bytes
    become floats, compute and local time are derived, and a pace given is the one read."""
    nan = math.nan
    busy, idle = rank_stats_from_columns(
        rank=[0, 1],
        host=["a", "a"],
        device=["cpu", "cpu"],
        loader=[None, None],
        steps=[10, 0],
        step_s=[0.2, math.inf],
        data_wait_s=[0.05, nan],
        h2d_s=[0.0, nan],
        forward_s=[0.05, nan],
        backward_s=[0.04, nan],
        optimizer_s=[0.01, nan],
        collective_wait_s=[0.05, None],
        batch_size=[32, 7],
        micro_batches=[2, 3],
        rss_bytes=[1000, 5],
        mem_allocated_bytes=[None, 5],
        mem_peak_bytes=[2000, 5],
        cpu_sampled=[True, False],
        main_cpu=[0.5, 0.7],
        worker_cpu=[1.5, 2.0],
        workers=[3, 2],
        main_rss_bytes=[1000, 5],
        mean_step_s=[0.25, 0.3],
    )
    view = RankView(info=RankInfo(rank=1, world_size=0, host="a"), steps=())
    assert vars(idle) == vars(rank_stats(view))
    sample = StepSample(
        rank=0, step=0, time=NOW, step_s=0.2, data_wait_s=0.05, h2d_s=0.0, forward_s=0.05,
        backward_s=0.04, optimizer_s=0.01, collective_wait_s=0.05, batch_size=32,
        rss_bytes=1000, mem_peak_bytes=2000, micro_batches=2, count=10,
    )  # fmt: skip
    cpu = ProcessCpu(rank=0, time=NOW, pid=0, main_cpu=0.5, worker_cpu=(0.5,) * 3, rss_bytes=1000)
    reduced = rank_stats(RankView(info=RankInfo(0, 0, host="a"), steps=(sample,), cpu=(cpu,)))
    assert vars(busy) == vars(dataclasses.replace(reduced, mean_step_s=0.25))
    assert busy.compute_s == pytest.approx(0.1) and busy.local_s == pytest.approx(0.15)
    assert busy.paced().step_s == 0.25 and busy.paced().data_wait_s == 0.05
    assert (busy.batch_size, busy.micro_batches, busy.main_rss_bytes) == (32.0, 2.0, 1000.0)


def test_only_the_gpus_of_the_jobs_asked_for() -> None:
    answers = two_ranks()
    gpu_answers(answers, "GPU-a", index=0, job=JOB, rank="0")
    gpu_answers(answers, "GPU-free", index=2)
    gpu_answers(answers, "GPU-other", index=3, job="other", rank="0")
    rank_answers(answers, 0, job="other")
    snaps = build_snapshots(answers, NOW, WINDOW, jobs=[JOB])
    assert {g.uuid for g in snaps[JOB].gpus} == {"GPU-a", "GPU-free"}


def test_memory_asks_only_for_the_kinds_the_rules_read() -> None:
    exprs = queries(WINDOW)
    asked = sorted(key for key in exprs if key.startswith("memory:"))
    assert asked == sorted(sub_key("memory", kind) for kind in ("rss", "allocated", "peak"))
    for key in asked:
        assert f'memory="{key.split(":")[1]}"' in exprs[key]
    assert not {"steps_total", "gpu_processes", "gpu_first", "gpu_last"} & set(queries(WINDOW))
