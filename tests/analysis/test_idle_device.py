"""idle_device: memory held on a GPU that computes nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import idle_device
from auditor.analysis.rules.idle_device import KIND
from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.samples import Batch, DeviceSample, GpuProcess
from tests.helpers.gpus import GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, balanced, with_rank
from tests.helpers.units import GIB, MIB

FREE = GpuSpec(util=0.0, mem_used=4 * MIB, processes=(), throttle=("gpu_idle",))
STRAY = GpuSpec(
    util=0.0,
    mem_used=12 * GIB,
    processes=(GpuProcess(pid=31337, used_bytes=12 * GIB),),
    throttle=("gpu_idle",),
)


def two_ranks_on_four_gpus(gpu2: GpuSpec, gpu3: GpuSpec = FREE, *, steps: int = 24) -> Snapshot:
    """A balanced 2-rank DDP job on GPUs 0 and 1 of a 4-GPU node."""
    job = JobBuilder(balanced(2)).run(steps)
    attach_gpus(job, [GpuSpec(), GpuSpec(), gpu2, gpu3], owners=[[0], [1], [], []])
    return job.snapshot()


def test_stray_process_on_an_idle_gpu_is_named_with_its_pid() -> None:
    findings = analyze(two_ranks_on_four_gpus(STRAY))
    assert [f.kind for f in findings] == ["idle_device"]
    (f,) = findings
    uuid = gpu_uuid("node0", 2)
    assert f.ranks == ()
    assert f.severity == "warning"
    assert f.predicted_speedup is None
    assert f.evidence["gpus"] == [
        {
            "uuid": uuid,
            "node": "node0",
            "index": 2,
            "model": "NVIDIA H100 80GB HBM3",
        }
    ]
    assert f.gpus == (uuid,)
    assert f.evidence["pids"] == [31337]
    assert f.evidence["held_bytes"] == 12 * GIB
    # No rank's fix: stop PID 31337 on the GPU, which no rank of the job owns.
    assert f.fixes == (Fix("stray_process", None, 31337, None, None, (KIND,), uuid),)
    assert f.facts == idle_device.Facts(
        "node0 GPU 2", "node0", (31337,), 12 * GIB, 0.0, f.facts.window_s
    )
    assert f.facts.window_s > 0


def test_an_unlisted_holder_gets_one_fix_without_a_pid() -> None:
    (f,) = idle_device.RULE(two_ranks_on_four_gpus(replace(STRAY, processes=())))
    assert f.facts.pids == ()
    assert f.fixes == (Fix("stray_process", None, None, None, None, (KIND,), gpu_uuid("node0", 2)),)


@pytest.mark.parametrize(
    ("gpu2", "kwargs", "expected"),
    [
        pytest.param(STRAY, {}, [((), 2)], id="stray-pid"),
        pytest.param(FREE, {}, [], id="free-gpu"),
        # NVML lists no process (container) but 12 GiB are in use.
        pytest.param(replace(STRAY, processes=()), {}, [((), 2)], id="unlisted-process"),
        pytest.param(
            replace(STRAY, processes=(), mem_used=512 * MIB), {}, [], id="unlisted-under-floor"
        ),
        # A listed process counts whatever it holds.
        pytest.param(
            replace(STRAY, processes=(GpuProcess(pid=5, used_bytes=300 * MIB),)),
            {},
            [((), 2)],
            id="small-listed-process",
        ),
        pytest.param(replace(STRAY, util=0.05), {}, [], id="busy-5%"),
        pytest.param(replace(STRAY, util=0.05), {"max_util": 0.1}, [((), 2)], id="max-util"),
        pytest.param(replace(STRAY, util=None), {}, [], id="util-unknown-is-not-idle"),
        pytest.param(replace(STRAY, lost_after=1.0), {}, [], id="lost-is-not-idle"),
        pytest.param(STRAY, {"min_steps": 25}, [], id="job-not-running-long-enough"),
        pytest.param(STRAY, {"min_samples": 1000}, [], id="too-few-samples"),
    ],
)
def test_decision_table(gpu2: GpuSpec, kwargs: dict, expected: list) -> None:
    findings = idle_device.RULE(two_ranks_on_four_gpus(gpu2), **kwargs)
    assert [(f.ranks, f.evidence["gpus"][0]["index"]) for f in findings] == expected
    assert [f.gpus for f in findings] == [(gpu_uuid("node0", i),) for _, i in expected]


def cpu_rank_holding_gpu1() -> Snapshot:
    """Rank 1 trains on the CPU (its probe times no device) while NVML lists its process on
    GPU 1, holding 2 GiB there: it never computes on the GPU it holds."""
    job = JobBuilder(with_rank(balanced(2), 1, device="cpu")).run(24)
    attach_gpus(job, [GpuSpec(), replace(FREE, mem_used=2 * GIB, processes=None)], link="pid")
    return job.snapshot()


def test_the_owning_rank_is_blamed() -> None:
    (f,) = idle_device.RULE(cpu_rank_holding_gpu1())
    uuid = gpu_uuid("node0", 1)
    assert f.ranks == (1,)
    assert f.evidence["gpus"][0]["index"] == 1
    assert (f.facts.label, f.facts.held_bytes) == ("node0 GPU 1", 2 * GIB)
    # The rank's placement: it allocates on a GPU it never computes on.
    assert f.fixes == (Fix("gpu_assignment", 1, uuid, None, None, (KIND,), uuid),)


def test_a_rank_with_a_stray_context_on_an_unowned_idle_gpu_is_blamed() -> None:
    job = JobBuilder(balanced(2)).run(24)
    ctx = replace(FREE, mem_used=600 * MIB, processes=(GpuProcess(10_000, 600 * MIB),))
    attach_gpus(job, [GpuSpec(), GpuSpec(), FREE, ctx], owners=[[0], [1], [], []], link="pid")
    (f,) = idle_device.RULE(job.snapshot())
    uuid = gpu_uuid("node0", 3)
    assert f.ranks == (0,)
    assert f.evidence["gpus"][0]["index"] == 3
    assert f.fixes == (Fix("stray_process", 0, uuid, None, None, (KIND,), uuid),)


def test_node_only_view_without_ranks_is_judged() -> None:
    job = JobBuilder(balanced(2)).run(24)
    attach_gpus(job, [GpuSpec(), GpuSpec(), STRAY, FREE], owners=[[0], [1], [], []])
    store = SampleStore()
    snap = job.snapshot()
    store.add(Batch(devices=snap.devices))
    (f,) = idle_device.RULE(store.snapshot(now=snap.end, window_s=None))
    assert (f.ranks, f.evidence["gpus"][0]["index"]) == ((), 2)


def test_several_idle_gpus_one_finding_each() -> None:
    findings = idle_device.RULE(two_ranks_on_four_gpus(STRAY, replace(STRAY, mem_used=GIB)))
    assert [f.evidence["gpus"][0]["index"] for f in findings] == [2, 3]


# --- judged while its owners train ---------------------------------------------------------------


def with_startup_and_teardown(
    world: int,
    *,
    util: float | None = 0.97,
    startup_s: float = 20.0,
    teardown_s: float = 5.0,
    specs: list | None = None,
) -> Snapshot:
    """A balanced job of ``world`` ranks on GPUs 0..world-1, 24 steps (2.5 s) of training,
    with NVML reading each GPU once every 0.25 s for ``startup_s`` before the first step and
    ``teardown_s`` after the last: 0% busy, the owning rank's process holding 3 GiB (CUDA
    context, the model loaded, the rendezvous; then the process ending)."""
    job = JobBuilder(specs or balanced(world)).run(24)
    uuids = attach_gpus(job, [GpuSpec(util=util, mem_used=3 * GIB)] * world)
    first = min(s.time - s.step_s for s in job.store.snapshot(job.now, None).ranks[0].steps)
    pid = {i.rank: i.pid for i in job.infos()}
    idle: list[DeviceSample] = []
    times = [first - startup_s + 0.25 * k for k in range(int(startup_s * 4))]
    times += [job.now + 0.25 * (k + 1) for k in range(int(teardown_s * 4))]
    for t in times:
        for r, uuid in enumerate(uuids):
            idle.append(
                DeviceSample(
                    node="node0",
                    index=r,
                    uuid=uuid,
                    time=t,
                    gpu_util=0.0,
                    mem_used_bytes=3 * GIB,
                    mem_total_bytes=80 * GIB,
                    processes=(GpuProcess(pid=pid[r], used_bytes=3 * GIB),),
                )
            )
    job.store.add(Batch(devices=tuple(idle)))
    return job.store.snapshot(now=job.now + teardown_s, window_s=None)


@pytest.mark.parametrize("world", [2, 8])
def test_start_up_and_teardown_are_not_idleness(world: int) -> None:
    # 20 s of start-up and 5 s of teardown at 0% around 2.5 s of training: over the whole
    # window NVML's median reads 0%, over its owners' training 97%.
    snap = with_startup_and_teardown(world)
    assert all(d.gpu_util == 0.0 for _, d in snap.gpus_in_place)
    assert idle_device.RULE(snap) == []
    assert [f for f in analyze(snap) if f.kind == "idle_device"] == []


@pytest.mark.parametrize("world", [2, 8])
def test_a_gpu_its_ranks_compute_on_is_never_idle(world: int) -> None:
    # NVML reads 0% even while the ranks train (a reading that missed every kernel), yet each
    # CUDA rank times 100 ms of its 105 ms steps on the device: the ranks' word wins.
    snap = with_startup_and_teardown(world, util=0.0)
    assert idle_device.RULE(snap) == []
    # A rank that trains on the CPU and holds memory on its GPU is idle there all the same:
    # rank 1 (and only rank 1) is blamed, judged over the training (2.5 s, not 27.5 s).
    specs = with_rank(balanced(world), 1, device="cpu")
    found = idle_device.RULE(with_startup_and_teardown(world, util=0.0, specs=specs))
    assert [f.ranks for f in found] == [(1,)]
    assert found[0].facts.window_s < 3.0


def test_a_gpu_whose_owners_have_not_stepped_is_starting_up() -> None:
    # Rank 1 has not reached its first step; its GPU holds memory at 0%: not judged yet.
    job = JobBuilder(balanced(2)).run(24)
    attach_gpus(job, [GpuSpec(), replace(FREE, mem_used=2 * GIB, processes=None)])
    snap = job.snapshot()
    views = tuple(replace(v, steps=()) if v.info.rank == 1 else v for v in snap.ranks)
    history = {r: h for r, h in snap.history.items() if r != 1}
    waiting = Snapshot(
        job=snap.job,
        start=snap.start,
        end=snap.end,
        ranks=views,
        devices=snap.devices,
        history=history,
    )
    assert idle_device.RULE(waiting) == []
