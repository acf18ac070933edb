"""`auditor replay`: ticks, time shifting, loops that never reset a counter, the job override,
one node per endpoint, and a real HTTP scrape of a recorded GPU scenario served by the CLI."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import build_parser, main
from auditor.cli.replay import replay_config
from auditor.metrics.exporter import make_registry
from auditor.metrics.replay import (
    Replay,
    ReplayError,
    make_ticks,
    select_node,
)
from auditor.metrics.state import ExportState, apply_batch
from auditor.samples import Batch, DeviceSample, NodeCpu, ProcessCpu, RankInfo, StepSample
from auditor.telemetry.recorded import Recording, read_recording
from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
IDLE = REPO / "tests" / "data" / "idle_allocated_gpu" / "recording.jsonl"

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]

T0 = 5000.0
NODE = "n1"


def info(rank: int, *, host: str = NODE, uuid: str = "", job: str = "rec") -> RankInfo:
    return RankInfo(
        rank=rank,
        world_size=2,
        local_rank=rank,
        host=host,
        pid=100 + rank,
        device=f"cuda:{rank}",
        parallel_mode="ddp",
        devices=(rank,),
        device_uuids=(uuid,) if uuid else (),
        job=job,
    )


def dev(uuid: str, index: int, t: float, util: float, *, node: str = NODE) -> DeviceSample:
    return DeviceSample(node=node, index=index, uuid=uuid, time=t, model="H200", gpu_util=util)


def small_recording(*, job: str = "rec") -> Recording:
    """Two ranks stepping every 0.5 s from T0 to T0+2 (steps 0..4), GPUs a and b theirs and c
    nobody's, read at T0+0.2 and T0+1.2. With 1 s ticks: T0 {step 0}, T0+1 {steps 1, 2, reads
    at .2}, T0+2 {steps 3, 4, reads at 1.2}."""
    steps = tuple(
        StepSample(rank=r, step=k, time=T0 + 0.5 * k, step_s=0.5, forward_s=0.25, batch_size=8)
        for k in range(5)
        for r in (0, 1)
    )
    devices = tuple(
        dev(uuid, i, T0 + dt, util)
        for dt, util in ((0.2, 0.5), (1.2, 0.75))
        for i, uuid in enumerate(("GPU-a", "GPU-b", "GPU-c"))
    )
    batch = Batch(
        infos=(info(0, uuid="GPU-a", job=job), info(1, uuid="GPU-b", job=job)),
        steps=steps,
        processes=tuple(
            ProcessCpu(rank=r, time=T0 + dt, pid=100 + r, main_cpu=1.0, worker_cpu=(0.5, 0.25))
            for dt in (0.2, 1.2)
            for r in (0, 1)
        ),
        nodes=tuple(
            NodeCpu(host=NODE, time=T0 + dt, cores=8.0, busy_cores=2.0, load1=1.5)
            for dt in (0.2, 1.2)
        ),
        devices=devices,
    )
    return Recording(header={"schema": "auditor.recording/v1", "job": job}, batch=batch)


class FakeClock:
    """Wall clock for the engine: ``wait`` advances it instead of sleeping, and stops the
    replay after ``stop_after`` waits; ``seen`` holds (time, ticks applied, rank 0 steps)
    before each wait."""

    def __init__(self, t: float, stop_after: int | None = None) -> None:
        self.t = t
        self.stop_after = stop_after
        self.replay: Replay | None = None
        self.seen: list[tuple[float, int, int]] = []
        self.texts: list[str] = []

    def __call__(self) -> float:
        return self.t

    def wait(self, seconds: float) -> bool:
        assert self.replay is not None
        totals = self.replay.state.totals.get(0)
        self.seen.append((self.t, self.replay.applied, totals.steps if totals else 0))
        self.texts.append(scrape_state(self.replay.state))
        self.t += seconds
        return self.stop_after is not None and len(self.seen) >= self.stop_after


def play(
    rec: Recording, start: float = 100.0, stop_after: int | None = None, **kw: object
) -> Replay:
    clock = FakeClock(start, stop_after)
    replay = Replay(rec, clock=clock, wait=clock.wait, **kw)  # type: ignore[arg-type]
    clock.replay = replay
    replay.run()
    return replay


def scrape_state(state: ExportState) -> str:
    return generate_latest(make_registry(lambda: state)).decode()


def parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def values(series: Series, name: str, **labels: str) -> list[float]:
    """Values of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return [v for (n, lab), v in series.items() if n == name and want <= set(lab)]


# --- ticks -----------------------------------------------------------------------------------
def test_samples_grouped_into_ticks_never_before_their_time() -> None:
    ticks = make_ticks(small_recording().batch, tick_s=1.0)
    assert [t.at for t in ticks] == [T0, T0 + 1, T0 + 2]
    assert [[(s.rank, s.step) for s in t.batch.steps] for t in ticks] == [
        [(0, 0), (1, 0)],
        [(0, 1), (1, 1), (0, 2), (1, 2)],
        [(0, 3), (1, 3), (0, 4), (1, 4)],
    ]
    assert [[d.time - T0 for d in t.batch.devices] for t in ticks] == [
        [],
        pytest.approx([0.2] * 3),
        pytest.approx([1.2] * 3),
    ]
    assert [len(t.batch.infos) for t in ticks] == [2, 0, 0]  # identities before any step


def test_real_recording_ticks_hold_every_sample_once() -> None:
    batch = read_recording(IDLE).batch
    ticks = make_ticks(batch)
    assert batch.steps and batch.devices and len(ticks) > 1, "nothing to check in the recording"
    assert sum(len(t.batch.steps) for t in ticks) == len(batch.steps)
    assert sum(len(t.batch.devices) for t in ticks) == len(batch.devices)
    for prev, tick in itertools.pairwise(ticks):
        assert prev.at < tick.at
        b = tick.batch
        times = [x.time for x in b.steps] + [x.time for x in b.devices]
        times += [x.time for x in b.processes] + [x.time for x in b.nodes]
        assert all(prev.at < t <= tick.at for t in times)


# --- time shifting ---------------------------------------------------------------------------
def test_first_sample_is_now_and_every_time_shifted() -> None:
    replay = play(small_recording(), start=100.0)
    st = replay.state
    assert replay.applied == 3
    last = st.totals[0].last
    assert last is not None and (last.step, last.time) == (4, 102.0)
    assert st.gpus["GPU-a"].sample is not None and st.gpus["GPU-a"].sample.time == pytest.approx(
        101.2
    )
    assert st.cpu[1].time == pytest.approx(101.2)
    assert st.node_cpu is not None and st.node_cpu.time == pytest.approx(101.2)
    first_at, first = next(Replay(small_recording()).schedule(100.0))
    assert first_at == 100.0 and {s.time for s in first.steps} == {100.0}


def test_speed_compresses_the_timeline_but_not_durations() -> None:
    replay = play(small_recording(), start=100.0, speed=4.0)
    last = replay.state.totals[0].last
    assert last is not None and last.time == pytest.approx(100.5)
    assert last.step_s == 0.5
    assert replay.state.totals[0].step_seconds == pytest.approx(2.5)


def test_ticks_applied_in_order_and_on_time() -> None:
    clock = FakeClock(100.0)
    replay = Replay(small_recording(), clock=clock, wait=clock.wait)
    clock.replay = replay
    replay.run()
    # Before each wait: the time, ticks applied, rank 0's steps -- nothing ahead of the clock.
    assert clock.seen == [(100.0, 1, 1), (101.0, 2, 3)]
    assert (clock.t, replay.applied, replay.state.totals[0].steps) == (102.0, 3, 5)


def test_stop_ends_a_waiting_replay() -> None:
    replay = Replay(small_recording(), speed=0.001)  # the real wait: 1000 s to the second tick
    player = threading.Thread(target=replay.run)
    player.start()
    wait_for(lambda: replay.applied > 0, timeout=10, what="the first tick", every=0.01)
    replay.stop()
    player.join(timeout=5)
    assert not player.is_alive() and replay.applied == 1


# --- loops -----------------------------------------------------------------------------------
def test_counters_never_go_backwards_across_loops() -> None:
    # 3 ticks per pass, a tick apart across the seam: the 10th wait stops it after 10 ticks.
    replay = play(small_recording(), start=100.0, stop_after=10, loop=True)
    assert replay.applied == 10
    tot = replay.state.totals[0]
    assert tot.steps == 3 * 5 + 1 and tot.step_seconds == pytest.approx(16 * 0.5)
    assert tot.last is not None and (tot.last.step, tot.last.time) == (15, 109.0)
    sample = replay.state.gpus["GPU-a"].sample
    assert sample is not None and sample.time == pytest.approx(107.2)  # the third pass's last read


def test_scraped_counters_monotonic_and_last_step_advancing_across_loops() -> None:
    clock = FakeClock(100.0, stop_after=12)
    replay = Replay(small_recording(), loop=True, clock=clock, wait=clock.wait)
    clock.replay = replay
    replay.run()
    scrapes = [parse(t) for t in clock.texts]
    counters = {k for s in scrapes for k in s if k[0].endswith("_total")}
    assert {k[0] for k in counters} >= {
        "auditor_rank_steps_total",
        "auditor_rank_step_seconds_total",
        "auditor_rank_phase_seconds_total",
        "auditor_rank_samples_total",
    }
    for key in counters:
        seen = [s[key] for s in scrapes if key in s]
        assert seen == sorted(seen), key
    last = [values(s, "auditor_rank_last_step_timestamp_seconds", rank="0")[0] for s in scrapes]
    assert len(last) > 1 and all(a < b for a, b in itertools.pairwise(last))


def test_lost_gpu_stays_lost_in_later_passes() -> None:
    rec = small_recording()
    lost = replace(dev("GPU-c", 2, T0 + 1.2, 0.0), gpu_util=None, lost=True)
    rec = Recording(
        header=rec.header,
        batch=replace(
            rec.batch, devices=(*(d for d in rec.batch.devices if d.time < T0 + 1), lost)
        ),
    )
    batches = [b for _, b in itertools.islice(Replay(rec, loop=True).schedule(0.0), 6)]
    c = [d for b in batches for d in b.devices if d.uuid == "GPU-c"]
    assert [d.lost for d in c] == [False, True, True, True]  # pass 2's first read is lost too


# --- labels ----------------------------------------------------------------------------------
def test_job_defaults_to_the_recording_and_can_be_overridden() -> None:
    assert play(small_recording(job="rec")).state.job == "rec"
    text = scrape_state(play(small_recording(job="rec"), job="demo").state)
    series = parse(text)
    assert 'auditor_job="rec"' not in text
    assert values(
        series, "auditor_gpu_utilization_ratio", uuid="GPU-a", auditor_job="demo", rank="0"
    )
    assert values(series, "auditor_gpu_utilization_ratio", uuid="GPU-c", auditor_job="", rank="")
    assert values(series, "auditor_rank_steps_total", auditor_job="demo", rank="1") == [5.0]


def test_one_node_per_endpoint() -> None:
    rec = small_recording()
    other = Batch(
        infos=(info(2, host="n2", uuid="GPU-z"),),
        steps=(StepSample(rank=2, step=0, time=T0, step_s=0.5),),
        devices=(dev("GPU-z", 0, T0 + 0.2, 0.25, node="n2"),),
        nodes=(NodeCpu(host="n2", time=T0 + 0.2, cores=4.0, busy_cores=1.0, load1=1.0),),
    )
    both = Batch(
        infos=rec.batch.infos + other.infos,
        steps=rec.batch.steps + other.steps,
        processes=rec.batch.processes,
        nodes=rec.batch.nodes + other.nodes,
        devices=rec.batch.devices + other.devices,
    )
    with pytest.raises(ReplayError, match=r"2 nodes \(n1, n2\).*--node"):
        select_node(both)
    with pytest.raises(ReplayError, match="'n3' is not in the recording"):
        select_node(both, "n3")
    node, mine = select_node(both, "n2")
    assert node == "n2" and [i.rank for i in mine.infos] == [2] and len(mine.steps) == 1
    assert [d.uuid for d in mine.devices] == ["GPU-z"] and mine.processes == ()
    st = play(Recording(header=rec.header, batch=both), node="n2").state
    assert (st.node, sorted(st.gpus), sorted(st.infos)) == ("n2", ["GPU-z"], [2])
    assert st.node_cpu is not None and st.node_cpu.host == "n2"


def test_as_node_renames_every_sample_of_the_node() -> None:
    st = play(small_recording(), as_node="demo-1").state
    assert st.node == "demo-1"
    assert {i.host for i in st.infos.values()} == {"demo-1"}
    assert st.node_cpu is not None and st.node_cpu.host == "demo-1"
    assert {g.sample.node for g in st.gpus.values() if g.sample is not None} == {"demo-1"}
    text = scrape_state(st)
    assert 'node="n1"' not in text and 'node="demo-1"' in text


def test_apply_batch_keeps_newest_reads_and_revives_ranks() -> None:
    st = ExportState(job="j", node=NODE, ended={0})
    newer, older = dev("GPU-a", 0, 10.0, 0.75), dev("GPU-a", 0, 9.0, 0.5)
    st = apply_batch(st, Batch(infos=(info(0),), devices=(newer,)))
    st = apply_batch(st, Batch(devices=(older,), ended=(1,)))
    assert st.gpus["GPU-a"].sample == newer and st.gpus["GPU-a"].up
    assert st.ended == {1} and 0 in st.infos


# --- the command -----------------------------------------------------------------------------
def test_options_have_environment_twins() -> None:
    ns = build_parser().parse_args(["replay", "r.jsonl", "--speed", "2"])
    env = {"AUDITOR_SPEED": "4", "AUDITOR_LOOP": "1", "AUDITOR_JOB": "demo"}
    cfg = replay_config(ns, env)
    assert (cfg.recording, cfg.speed, cfg.loop, cfg.job) == ("r.jsonl", 2.0, True, "demo")
    assert (cfg.metrics_host, cfg.metrics_port) == ("127.0.0.1", 9400)


MISSING = object()  # no file at all


@pytest.mark.parametrize(
    ("content", "args", "env", "message"),
    [
        (MISSING, [], {}, "recording.jsonl: cannot open: No such file"),
        ("not json\n", [], {}, "not an auditor recording"),
        ('{"schema":"auditor.recording/v1","job":"x"}\n', [], {}, "no samples to replay"),
        (IDLE, [], {"AUDITOR_SPEED": "-1"}, "AUDITOR_SPEED: must be positive"),
        (IDLE, ["--node", "nope"], {}, "'nope' is not in the recording"),
    ],
)
def test_cli_errors_are_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    content: object,
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    path = tmp_path / "recording.jsonl"
    if isinstance(content, Path):
        path = content
    elif isinstance(content, str):
        path.write_text(content)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["replay", str(path), "--metrics-port", "0", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("auditor: error: ") and message in err


def test_cli_port_in_use_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["replay", str(IDLE), "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot serve on 127.0.0.1:{port}" in err


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


SERVE_ARGS = ("--metrics-port", "0", "--speed", "20", "--loop")


def test_served_replay_scraped_over_http(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUDITOR_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "auditor", "replay", str(IDLE), *SERVE_ARGS],
        cwd=REPO,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = "-"
        while line and "http://" not in line:
            line = proc.stderr.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.rsplit(" ", 1)[1].strip()

        def with_gpus() -> str | None:
            text = _get(url)
            return text if "auditor_gpu_utilization_ratio" in text else None

        # GPUs are first read in the recording's second tick (a twentieth of a second here).
        first = wait_for(with_gpus, timeout=20, what=f"GPU series at {url}", every=0.05)
        time.sleep(0.5)  # 10 s of recording at speed 20
        second = _get(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=20)
    assert proc.returncode == 0, rest
    assert "replay stopped" in rest

    series = parse(first)
    job = "idle_allocated_gpu"
    util = {
        dict(labels)["gpu"]: dict(labels)
        for (name, labels) in series
        if name == "auditor_gpu_utilization_ratio"
    }
    assert sorted(util) == ["0", "1", "2", "3"]
    assert [(util[g]["auditor_job"], util[g]["rank"]) for g in "0123"] == [
        (job, "0"),
        (job, "1"),
        ("", ""),  # PID 39127 holds memory on GPU 2 but is no rank of the job
        ("", ""),
    ]
    assert all(u["node"] == "gpu-node-07" for u in util.values())
    steps1 = values(series, "auditor_rank_steps_total", auditor_job=job, rank="0")
    steps2 = values(parse(second), "auditor_rank_steps_total", auditor_job=job, rank="0")
    assert steps1 and steps2 and steps2[0] > steps1[0]
    # Shifted to now: near the wall clock and none of the recorded times.
    ts = values(parse(second), "auditor_rank_last_step_timestamp_seconds", rank="0")[0]
    assert abs(ts - time.time()) < 60
    assert ts not in {s.time for s in read_recording(IDLE).batch.steps}

    promtool = require_tool("promtool")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=first, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and check.stdout == "" and check.stderr == "", check
