"""Host sampling with a fake process table: rank and worker CPU, vanished processes, node CPU,
and the cores a cgroup quota leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.telemetry.host import HostSampler, available_cores

from . import ProcTable


def sampler(table: ProcTable, *, system: float = 25.0, cores: float = 4.0) -> HostSampler:
    return HostSampler(
        host="node-a",
        process=table,
        system_cpu_percent=lambda: system,
        logical_cpus=lambda: 8,
        cores=lambda: cores,
        loadavg=lambda: (2.5, 1.0, 0.5),
        clock=lambda: 123.0,
    )


def test_main_and_worker_cpu_from_children() -> None:
    t = ProcTable()
    t.add(100, cpu=150.0, rss=1000, children=[101, 102])
    t.add(101, cpu=90.0, rss=10)
    t.add(102, cpu=80.0, rss=20)
    s = sampler(t)
    s.track(0, 100)
    (first,), node = s.sample()
    assert first.rank == 0 and first.pid == 100 and first.time == 123.0
    assert first.main_cpu == pytest.approx(1.5)
    assert first.rss_bytes == 1000
    # psutil measures a new Process object from its first call on: no worker reading yet
    assert first.worker_cpu == () and first.worker_rss_bytes is None
    (second,), _ = s.sample()
    assert second.worker_cpu == pytest.approx((0.9, 0.8))
    assert second.worker_rss_bytes == 30
    assert second.workers == 2 and second.worker_cpu_total == pytest.approx(1.7)
    assert node.host == "node-a" and node.time == 123.0
    assert node.cores == 4.0
    assert node.busy_cores == pytest.approx(2.0)  # 25 % of 8 logical CPUs
    assert node.load1 == 2.5


def test_busy_cores_never_exceed_the_cores_available() -> None:
    _, node = sampler(ProcTable(), system=100.0, cores=1.5).sample()
    assert node.cores == 1.5 and node.busy_cores == 1.5


def test_declared_workers_override_children() -> None:
    t = ProcTable()
    t.add(100, cpu=100.0, children=[101, 102])  # e.g. a compiler and a pin-memory helper
    t.add(101, cpu=50.0)
    t.add(102, cpu=50.0)
    t.add(201, cpu=70.0, rss=5)
    s = sampler(t)
    s.set_workers(0, 100, (201,))  # tracks the rank too
    s.sample()
    (p,), _ = s.sample()
    assert p.worker_cpu == pytest.approx((0.7,))
    assert p.worker_rss_bytes == 5
    assert 101 not in t.opened and 102 not in t.opened


def test_vanished_processes_are_dropped_without_error() -> None:
    t = ProcTable()
    main = t.add(100, cpu=100.0, children=[101, 102])
    t.add(101, cpu=50.0)
    w2 = t.add(102, cpu=40.0)
    other = t.add(300, cpu=10.0)
    s = sampler(t)
    s.track(0, 100)
    s.track(1, 300)
    s.sample()
    w2.gone = True  # a worker exits between samples (still listed by a stale parent)
    procs, _ = s.sample()
    assert {p.rank: p.worker_cpu for p in procs}[0] == pytest.approx((0.5,))
    main.gone = True  # the rank itself exits
    procs, node = s.sample()
    assert [p.rank for p in procs] == [1]
    assert node is not None
    other.gone = True
    assert s.sample()[0] == []
    s.track(2, 999)  # never existed: not tracked, no exception
    assert s.sample()[0] == []


def test_track_keeps_the_process_object_until_the_pid_changes() -> None:
    t = ProcTable()
    t.add(100, cpu=10.0)
    t.add(101, cpu=20.0)
    s = sampler(t)
    s.track(0, 100)
    s.track(0, 100)  # the same process again (e.g. a reconnect): keep psutil's history
    assert t.opened == [100]
    s.track(0, 101)  # the rank restarted as a new process
    assert t.opened == [100, 101]
    (p,), _ = s.sample()
    assert p.pid == 101
    s.forget(0)
    assert s.sample()[0] == []


def test_available_cores_honours_a_cgroup_quota(tmp_path: Path) -> None:
    cpu_max = tmp_path / "cpu.max"
    four = lambda: range(4)  # noqa: E731
    cpu_max.write_text("150000 100000\n")
    assert available_cores(affinity=four, cgroup_cpu_max=str(cpu_max)) == pytest.approx(1.5)
    cpu_max.write_text("max 100000\n")
    assert available_cores(affinity=four, cgroup_cpu_max=str(cpu_max)) == 4.0
    cpu_max.write_text("800000 100000\n")  # a quota above the affinity: affinity wins
    assert available_cores(affinity=four, cgroup_cpu_max=str(cpu_max)) == 4.0
    cpu_max.write_text("garbage\n")
    assert available_cores(affinity=four, cgroup_cpu_max=str(cpu_max)) == 4.0
    missing = str(tmp_path / "nope")
    assert available_cores(affinity=four, cgroup_cpu_max=missing) == 4.0
    assert available_cores(affinity=lambda: [], cgroup_cpu_max=missing) == 0.01  # never zero


def test_the_time_each_process_waited_for_a_core_per_second() -> None:
    t = ProcTable()
    t.add(100, cpu=60.0, children=[101, 102])
    t.add(101, cpu=10.0)
    t.add(102, cpu=10.0)
    # /proc/<pid>/schedstat's run-queue delay, seconds since each started, as the kernel
    # counts it: the main thread waits 0.2 s a second, each worker 0.3 s.
    delay = {100: 5.0, 101: 1.0, 102: 2.0}
    now = [100.0]
    s = HostSampler(
        host="node-a",
        process=t,
        system_cpu_percent=lambda: 100.0,
        logical_cpus=lambda: 2,
        cores=lambda: 2.0,
        loadavg=lambda: (5.0, 5.0, 5.0),
        clock=lambda: now[0],
        run_delay=delay.get,
    )
    s.track(0, 100)
    (first,), _ = s.sample()
    assert first.main_wait is None and first.worker_wait is None  # nothing to compare yet
    now[0] += 2.0
    delay.update({100: 5.4, 101: 1.6, 102: 2.6})
    (second,), _ = s.sample()
    assert second.main_wait == pytest.approx(0.2)
    assert second.worker_wait == pytest.approx(0.6)  # together
    # A worker that went away is forgotten; a new one has no wait until its second sample.
    t.procs[100].child_pids = [101, 103]
    t.add(103, cpu=10.0)
    delay.update({100: 5.6, 101: 1.9, 103: 0.5})
    now[0] += 1.0
    (third,), _ = s.sample()
    assert third.main_wait == pytest.approx(0.2)
    assert third.worker_cpu == pytest.approx((0.1,)) and third.worker_wait == pytest.approx(0.3)


def test_no_schedstat_is_no_wait_not_zero() -> None:
    t = ProcTable()
    t.add(100, cpu=60.0)
    now = [100.0]
    s = HostSampler(
        host="node-a",
        process=t,
        system_cpu_percent=lambda: 50.0,
        logical_cpus=lambda: 2,
        cores=lambda: 2.0,
        loadavg=lambda: (1.0, 1.0, 1.0),
        clock=lambda: now[0],
        run_delay=lambda pid: None,
    )
    s.track(0, 100)
    s.sample()
    now[0] += 1.0
    (p,), _ = s.sample()
    assert p.main_wait is None and p.worker_wait is None
