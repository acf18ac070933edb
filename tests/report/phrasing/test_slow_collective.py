"""slow_collective in words: the op, its bytes, transfer and bandwidth; no rank blamed; the
network's lever first."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.slow_collective import KIND, Facts, OpTransfer
from auditor.report.phrasing import phrase
from tests.helpers.units import MIB


def _finding(same_host: bool, op: str = "all_gather") -> Finding:
    o = OpTransfer(op, 0.060, 0.37, 64 * MIB, 64 * MIB / 0.06, 32 * MIB / 0.06, {0: 0.0, 1: 0.002})
    return Finding(KIND, "warning", (), Facts((o,), 0.37, 0.161, 2, same_host))


def test_summary_names_op_bytes_transfer_and_bandwidth() -> None:
    p = phrase(_finding(same_host=False))
    assert p.summary == (
        "the collectives themselves take 37% of every rank's step (2 ranks across hosts): "
        "all_gather of 64.0 MiB a step: 60 ms of transfer (37% of the step), 1.12 GB/s "
        "algorithm / 0.559 GB/s bus bandwidth; every rank pays it after the last one arrives, "
        "so no rank is to blame"
    )
    assert p.fixes == {}
    fix = str(p.notes["fix"])
    assert fix.startswith("check the network") and "NCCL_SOCKET_IFNAME" in fix
    assert "not predicted" in str(p.notes["speedup_model"])


def test_one_host_and_the_gradient_all_reduce_get_their_own_levers() -> None:
    fix = str(phrase(_finding(same_host=True, op="ddp_allreduce")).notes["fix"])
    assert "nvidia-smi topo -m" in fix and "bucket_cap_mb" in fix and "NCCL_SOCKET" not in fix


def test_an_object_collective_is_told_to_send_tensors_not_to_check_the_network() -> None:
    fix = str(phrase(_finding(same_host=True, op="all_gather_object")).notes["fix"])
    assert fix.startswith("all_gather_object pickles") and "network" not in fix


def test_gloo_on_one_hosts_cpus_is_told_no_network_and_no_gpu_transport() -> None:
    o = OpTransfer("ddp_allreduce", 0.006, 0.27, 4 * MIB, 4 * MIB / 0.006, None, {0: 0.0})
    cpu = Finding(KIND, "warning", (), Facts((o,), 0.27, 0.022, 2, True, on_gpu=False))
    fix = str(phrase(cpu).notes["fix"])
    assert fix.startswith("overlap more of the gradient all-reduce") and "nvidia-smi" not in fix
    across = Finding(KIND, "warning", (), Facts((o,), 0.27, 0.022, 2, False, on_gpu=False))
    assert str(phrase(across).notes["fix"]).startswith("check the interface gloo uses")
