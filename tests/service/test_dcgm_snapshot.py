"""serve's GPUs from dcgm-exporter's answers: joined to ranks by UUID, the auditor's units, the
SM clock's maximum where DCGM exports none, and the monitors' series first where both exist.
(The same against a real Prometheus: tests/e2e/test_dcgm_source.py.)"""

from __future__ import annotations

import pytest

from auditor.metrics.query import Series
from auditor.service.promqueries import DCGM, queries
from auditor.service.promsnapshot import gpu_stats

NOW = 1_800_000_000.0
H100 = "NVIDIA H100 80GB HBM3"


Hand = dict[str, list[Series]]


def put(answers: Hand, key: str, labels: dict[str, str], value: float) -> None:
    answers.setdefault(key, []).append(Series(labels, ((NOW, value),)))


def dcgm_gpu(answers: Hand, uuid: str, index: int, clock_hz: float) -> None:
    identity = {"uuid": uuid, "node": "dgx-1", "gpu": str(index), "model": H100}
    put(answers, DCGM + "gpu_up", identity, 0)
    for key, value in (
        ("gpu_samples", 30),
        ("gpu_span", 29),
        ("gpu_lost", 0),
        ("gpu_util", 0.97),
        ("gpu_mem_used", 52 * 2**30),
        ("gpu_mem_used_max", 52 * 2**30),
        ("gpu_mem_total", 80 * 2**30),
        ("gpu_sm_clock", clock_hz),
        ("gpu_temperature", 70),
        ("gpu_power", 600),
    ):
        put(answers, DCGM + key, {"uuid": uuid}, value)


@pytest.fixture
def answers() -> Hand:
    out: Hand = {}
    dcgm_gpu(out, "GPU-a", 0, 1.35e9)
    dcgm_gpu(out, "GPU-b", 1, 1.96e9)
    dcgm_gpu(out, "GPU-c", 2, 1.97e9)
    put(out, DCGM + "gpu_sm_clock_peak", {"modelName": H100}, 1980)
    # Rank 0 said it uses GPU-a (its node is n1: dcgm-exporter's Hostname is dgx-1).
    owner = {"uuid": "GPU-a", "auditor_job": "train", "rank": "0", "node": "n1"}
    put(out, DCGM + "gpu_owner", owner, 1)
    # GPU-a throttled for heat in 90% of the window; its driver reports reasons.
    put(out, DCGM + "gpu_throttle", {"uuid": "GPU-a", "reason": "sw_thermal_slowdown"}, 0.9)
    put(out, DCGM + "gpu_throttle_read", {"uuid": "GPU-a"}, 1)
    # GPU-c is also exported by the auditor's own monitor, with rank 1 as its owner.
    monitor = {"uuid": "GPU-c", "node": "n1", "gpu": "2", "model": H100}
    put(out, "gpu_up", {**monitor, "auditor_job": "train", "rank": "1"}, 1)
    for key, value in (("gpu_samples", 10), ("gpu_util", 0.5), ("gpu_sm_clock", 1.9e9)):
        put(out, key, {"uuid": "GPU-c"}, value)
    return out


def test_dcgm_gpus_join_their_rank_by_uuid(answers: Hand) -> None:
    gpus = gpu_stats(answers)
    a, job, rank = gpus["GPU-a"]
    assert (job, rank, a.node, a.index, a.model) == ("train", "0", "n1", 0, H100)
    assert a.samples == 30 and a.gpu_util == pytest.approx(0.97)
    assert a.mem_total_bytes == 80 * 2**30 and a.mem_ratio == pytest.approx(52 / 80)
    assert a.throttle_share == pytest.approx(0.9)
    assert a.throttle_reasons == ("sw_thermal_slowdown",)
    # No maximum exported: the model's highest clock in the window stands for it.
    assert a.sm_clock_max_mhz == pytest.approx(1980)
    assert a.sm_clock_ratio == pytest.approx(1350 / 1980)
    # A GPU no rank reported: no owner, dcgm-exporter's host name, throttling unknown.
    b, job, rank = gpus["GPU-b"]
    assert (job, rank, b.node) == ("", "", "dgx-1")
    assert b.throttle_share is None


def test_the_monitors_series_win_where_both_export_a_gpu(answers: Hand) -> None:
    c, job, rank = gpu_stats(answers)["GPU-c"]
    assert (job, rank, c.samples, c.gpu_util) == ("train", "1", 10, 0.5)


def test_the_lowest_rank_owns_a_gpu_two_ranks_name(answers: Hand) -> None:
    owner = {"uuid": "GPU-b", "auditor_job": "train", "node": "n1"}
    put(answers, DCGM + "gpu_owner", {**owner, "rank": "3"}, 1)
    put(answers, DCGM + "gpu_owner", {**owner, "rank": "2"}, 1)
    assert gpu_stats(answers)["GPU-b"][1:] == ("train", "2")


def test_no_dcgm_answers_no_dcgm_gpus(answers: Hand) -> None:
    del answers[DCGM + "gpu_up"]
    assert list(gpu_stats(answers)) == ["GPU-c"]


@pytest.mark.parametrize(
    ("source", "auditor", "dcgm"),
    [("auto", True, True), ("auditor", True, False), ("dcgm", False, True)],
)
def test_gpu_source_picks_the_queries(source: str, auditor: bool, dcgm: bool) -> None:
    q = queries(60, source)
    assert ("gpu_up" in q) is auditor and ("gpu_util" in q) is auditor
    assert (DCGM + "gpu_up" in q) is dcgm and (DCGM + "gpu_util" in q) is dcgm
    assert "rank_info" in q and "steps" in q
    if dcgm:
        assert next(k for k in q if k.startswith(DCGM)) == DCGM + "gpu_up"
