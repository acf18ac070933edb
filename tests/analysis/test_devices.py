"""devices: who owns each GPU, and each GPU's robust figures over the window."""

from __future__ import annotations

from typing import Any

import pytest

from auditor.analysis.devices import (
    device_stats,
    gpu_owners,
    linear_fit,
    rank_gpus,
    stray_ranks,
)
from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.samples import Batch, DeviceSample, GpuProcess, RankInfo
from tests.helpers.gpus import H100_TOTAL, GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, balanced
from tests.helpers.units import GIB, MIB


def _snap(infos: list[RankInfo], devices: list[DeviceSample]) -> Snapshot:
    store = SampleStore()
    store.add(Batch(infos=tuple(infos), devices=tuple(devices)))
    return store.snapshot(now=1e9, window_s=None)


def _dev(
    index: int,
    *,
    node: str = "node0",
    t: float = 100.0,
    pids: dict[int, int | None] | None = None,
    **kw: Any,
) -> DeviceSample:
    procs = tuple(GpuProcess(pid=p, used_bytes=b) for p, b in (pids or {}).items())
    return DeviceSample(
        node=node, index=index, uuid=gpu_uuid(node, index), time=t, processes=procs, **kw
    )


def _rank(rank: int, *, pid: int, host: str = "node0", **kw: Any) -> RankInfo:
    return RankInfo(rank=rank, world_size=4, host=host, pid=pid, **kw)


U = [gpu_uuid("node0", i) for i in range(4)]


@pytest.mark.parametrize(
    ("infos", "devices", "expected"),
    [
        pytest.param(
            [_rank(0, pid=1, device_uuids=(U[1],)), _rank(1, pid=2, device_uuids=(U[0],))],
            [_dev(0), _dev(1), _dev(2)],
            {U[0]: (1,), U[1]: (0,), U[2]: ()},
            id="by-uuid-the-ranks-own-word",
        ),
        pytest.param(
            [_rank(0, pid=11), _rank(1, pid=12)],
            [_dev(0, pids={11: GIB}), _dev(1, pids={12: GIB}), _dev(2)],
            {U[0]: (0,), U[1]: (1,), U[2]: ()},
            id="by-pid-on-the-same-host",
        ),
        pytest.param(
            [_rank(0, pid=11, host="node1")],
            [_dev(0, pids={11: GIB}), _dev(0, node="node1")],
            {U[0]: (), gpu_uuid("node1", 0): ()},
            id="same-pid-on-another-host-is-not-the-rank",
        ),
        pytest.param(
            [_rank(0, pid=11, host="")],
            [_dev(0, pids={11: GIB}), _dev(1)],
            {U[0]: (0,), U[1]: ()},
            id="hostless-rank-on-a-single-node",
        ),
        pytest.param(
            [_rank(0, pid=7, parallel_mode="dataparallel", devices=(0, 1, 2, 3))],
            [_dev(i, pids={7: GIB}) for i in range(4)],
            {U[0]: (0,), U[1]: (0,), U[2]: (0,), U[3]: (0,)},
            id="dataparallel-owns-every-gpu-it-is-on",
        ),
        pytest.param(
            # Rank 1 also holds a context on GPU 0: its own GPU is where it holds most.
            [_rank(0, pid=11, devices=(0,)), _rank(1, pid=12, devices=(1,))],
            [_dev(0, pids={11: 30 * GIB, 12: GIB // 2}), _dev(1, pids={12: 30 * GIB})],
            {U[0]: (0,), U[1]: (1,)},
            id="ddp-stray-context-is-not-ownership",
        ),
        pytest.param(
            # Memory unknown (container): the GPU at the rank's device index wins.
            [_rank(1, pid=12, devices=(1,))],
            [_dev(0, pids={12: None}), _dev(1, pids={12: None})],
            {U[0]: (), U[1]: (1,)},
            id="ddp-unknown-memory-falls-back-to-device-index",
        ),
        pytest.param(
            [_rank(0, pid=11, device_uuids=(U[3],))],
            [_dev(0, pids={11: GIB})],
            {U[0]: (), U[3]: (0,)},
            id="uuid-wins-over-pid-and-unsampled-gpu-listed",
        ),
    ],
)
def test_gpu_owners(
    infos: list[RankInfo], devices: list[DeviceSample], expected: dict[str, tuple[int, ...]]
) -> None:
    assert gpu_owners(_snap(infos, devices)) == expected


def test_rank_gpus_inverts_owners() -> None:
    owners = {U[0]: (0,), U[1]: (0, 1), U[2]: ()}
    assert rank_gpus(owners) == {0: (U[0], U[1]), 1: (U[1],)}


def test_stray_ranks_names_the_ranks_on_a_gpu_they_do_not_own() -> None:
    infos = [_rank(r, pid=10 + r, devices=(r,)) for r in range(3)]
    devices = [
        _dev(0, pids={10: 30 * GIB, 11: GIB // 2, 12: None}),
        _dev(1, pids={11: 30 * GIB}),
        _dev(2, pids={12: 30 * GIB}),
    ]
    assert stray_ranks(_snap(infos, devices)) == {U[0]: {1: GIB // 2, 2: None}}


def test_device_stats_medians_shares_and_trend() -> None:
    samples = [
        _dev(
            2,
            t=100.0 + i,
            model="NVIDIA H200",
            gpu_util=u,
            mem_used_bytes=10 * GIB + i * 100 * MIB,
            mem_total_bytes=H100_TOTAL,
            sm_clock_mhz=clock,
            sm_clock_max_mhz=1980.0,
            throttle_reasons=reasons,
            pcie_gen=gen,
            pcie_gen_max=5,
            pcie_width=16,
            pcie_width_max=16,
            pids={42: GIB},
        )
        for i, (u, clock, reasons, gen) in enumerate(
            [
                (0.9, 1980.0, (), 5),
                (0.8, 990.0, ("sw_thermal_slowdown",), 4),
                (0.7, 990.0, ("gpu_idle",), 1),
                (0.6, 990.0, ("sw_thermal_slowdown", "sw_power_cap"), 5),
                (0.5, 1980.0, None, 5),
            ]
        )
    ]
    d = device_stats(_snap([], samples))[gpu_uuid("node0", 2)]
    assert (d.node, d.index, d.model, d.samples, d.lost) == ("node0", 2, "NVIDIA H200", 5, False)
    assert d.gpu_util == pytest.approx(0.7)
    assert d.mem_used_bytes == pytest.approx(10 * GIB + 200 * MIB)
    assert d.mem_used_max_bytes == 10 * GIB + 400 * MIB
    assert d.mem_trend_bytes_per_s == pytest.approx(100 * MIB)
    assert d.mem_recent_trend_bytes_per_s == pytest.approx(100 * MIB)
    assert d.mem_rise_bytes == pytest.approx(400 * MIB)
    assert d.sm_clock_ratio == pytest.approx(0.5)
    # 4 samples had readable reasons; gpu_idle is not a throttle: 2 of 4.
    assert d.throttle_share == pytest.approx(0.5)
    assert d.throttle_reasons == ("sw_thermal_slowdown", "sw_power_cap")
    # The best link seen: gen 5 x16 reached, so not degraded despite the idle gen 1.
    assert (d.pcie_gen, d.pcie_width, d.pcie_degraded) == (5, 16, False)
    assert d.pids == (42,)
    assert d.ref == {
        "uuid": gpu_uuid("node0", 2),
        "node": "node0",
        "index": 2,
        "model": "NVIDIA H200",
    }
    assert d.label == "node0 GPU 2"


def test_device_stats_missing_is_none_never_zero() -> None:
    d = device_stats(_snap([], [_dev(0, t=1.0), _dev(0, t=2.0)]))[U[0]]
    for name in (
        "gpu_util",
        "mem_used_bytes",
        "mem_total_bytes",
        "mem_ratio",
        "mem_trend_bytes_per_s",
        "sm_clock_ratio",
        "throttle_share",
        "pcie_gen",
    ):
        assert getattr(d, name) is None, name
    assert d.pcie_degraded is None
    assert d.samples == 2


def test_degraded_link_and_lost_gpu() -> None:
    samples = [
        _dev(1, t=1.0, gpu_util=0.9, pcie_gen=4, pcie_gen_max=5, pcie_width=8, pcie_width_max=16),
        _dev(1, t=2.0, gpu_util=0.9, pcie_gen=4, pcie_gen_max=5, pcie_width=8, pcie_width_max=16),
        DeviceSample(node="node0", index=1, uuid=U[1], time=3.0, lost=True),
    ]
    d = device_stats(_snap([], samples))[U[1]]
    assert d.pcie_degraded is True
    assert d.pcie_text == "gen 4/5 x8/16"
    # Lost at the end: figures from the samples read before, and marked lost.
    assert d.lost is True
    assert d.samples == 2
    assert d.gpu_util == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("xs", "ys", "expected"),
    [
        pytest.param([16, 32, 64], [8.0, 12.0, 20.0], (4.0, 0.25, 1.0), id="exact-line"),
        pytest.param([1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0], (5.0, 0.0, 1.0), id="flat"),
        pytest.param([1, 1, 1], [1.0, 2.0, 3.0], None, id="one-x"),
        pytest.param([1], [1.0], None, id="one-point"),
    ],
)
def test_linear_fit(
    xs: list[float], ys: list[float], expected: tuple[float, float, float] | None
) -> None:
    out = linear_fit(xs, ys)
    if expected is None:
        assert out is None
    else:
        assert out == pytest.approx(expected)


def test_linear_fit_r2_below_one_for_noise() -> None:
    out = linear_fit([1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0])
    assert out is not None
    assert out[2] == pytest.approx(0.64)


def test_attached_gpus_link_ranks_both_ways() -> None:
    for link in ("uuid", "pid"):
        job = JobBuilder(balanced(4)).run(12)
        uuids = attach_gpus(job, [GpuSpec()] * 4, link=link)
        owners = gpu_owners(job.snapshot())
        assert owners == {u: (i,) for i, u in enumerate(uuids)}, link


def test_a_gpu_lost_for_the_whole_window_has_no_figures() -> None:
    lost = DeviceSample(node="node0", index=0, uuid=U[0], time=1.0, lost=True)
    d = device_stats(_snap([], [lost]))[U[0]]
    assert (d.lost, d.samples, d.gpu_util, d.mem_trend_bytes_per_s) == (True, 0, None, None)
