"""``bench/gpu_validate.py --dry-run``: the GPU validation's whole plan on the CPU, with the
recorded NVML source, so that the script a GPU machine runs is known to work before one is lent.

On the CPU the device-clock checks report figures only (there is no device timeline to check);
the verdicts, the memory budget, the recordings and the run judged over time (a long start-up,
a leak, a slowdown) are checked as on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLAN = {
    "nvml": ("fields", "sample_cost", "recording"),
    "phases": ("h2d", "forward", "backward", "optimizer", "add_up", "no_sync", "probe_cost"),
    "verdict": ("starved", "forward_straggler", "balanced", "shared_gpu"),
    "memory": ("fixed_part", "activations", "headroom_fits"),
    "sampling": ("cost",),
    "over_time": ("long_startup", "memory_growth", "slowdown"),
    "mfu": (
        "counted_bf16",
        "counted_fp32",
        "against_table",
        "bf16_over_fp32",
        "starved_to_data_wait",
    ),
}
# The ray group (the GPU monitor as a Ray actor of auditor run's embedded Ray) is its own test.
RAY_PLAN = ("monitor_actor", "no_gpu_slot", "sampling_cost")


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_dry_run_runs_every_check_of_the_plan(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_validate.py"),
            "--dry-run",
            "--only",
            *[",".join(PLAN)],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    doc = json.loads((tmp_path / "gpu_validate_dry_run.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert list(checks) == [f"{g}.{n}" for g, names in PLAN.items() for n in names], proc.stderr
    for c in checks.values():
        assert isinstance(c["holds"], bool) and c["figure"]
        assert ("holds" if c["holds"] else "falls short") in proc.stdout
    # What a CPU can prove as a GPU would: the verdicts with exact ranks, the exact budget.
    # And the run judged over time: a long start-up is no idleness and no warning; a leak is
    # memory_growth on its rank at the rate the rank measured itself; a rank that turned slow
    # halfway is named with its step.
    over_time = ("over_time.long_startup", "over_time.memory_growth", "over_time.slowdown")
    for name in ("verdict.starved", "verdict.forward_straggler", "verdict.balanced", *over_time):
        assert checks[name]["holds"], checks[name]["figure"]
    assert checks["memory.fixed_part"]["holds"], checks["memory.fixed_part"]["figure"]
    # The FLOPs the probe counts are exact on a CPU too (bf16 under CPU autocast, and fp32),
    # a CPU job has FLOP/s and no MFU, and the half-starved job waits for data.
    for name in ("mfu.counted_bf16", "mfu.counted_fp32", "mfu.against_table"):
        assert checks[name]["holds"], checks[name]["figure"]
    assert checks["mfu.starved_to_data_wait"]["holds"], checks["mfu.starved_to_data_wait"]
    assert doc["dry_run"] is True and doc["device"]["cuda"] is False
    held = all(c["holds"] for c in checks.values())
    assert proc.returncode == (0 if held else 1)
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .startswith(
            f"gpu_validate: {sum(c['holds'] for c in checks.values())}/{len(checks)} checks hold"
        )
    )


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_dry_run_ray_group_sees_the_monitor_actor_on_the_embedded_ray(tmp_path: Path) -> None:
    """The GPU monitor as a Ray actor of auditor run's own Ray: its GPU's samples come from it,
    it holds no GPU (nor CPU) slot, and its sampling thread's cost is read from its info()."""
    pytest.importorskip("ray")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_validate.py"), "--dry-run", "--only", "ray"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    doc = json.loads((tmp_path / "gpu_validate_dry_run.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert list(checks) == [f"ray.{n}" for n in RAY_PLAN], proc.stderr
    for c in checks.values():
        assert c["holds"], c["figure"]
    assert checks["ray.no_gpu_slot"]["detail"]["required_resources"]
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_ray_the_ray_group_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_validate as gv
    finally:
        sys.path.remove(str(REPO / "bench"))
    monkeypatch.setattr(gv, "_have_ray", lambda: False)
    plan = gv.Plan(False, "nvml", Path("."), Path("."), {}, 1.0, 1)
    (check,) = gv.check_ray(plan)
    assert not check.holds and check.line().startswith("falls short  ray: no Ray here")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda(), reason="a CUDA GPU is here: the script would run the real plan")
def test_without_a_gpu_and_without_dry_run_it_says_so() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_validate.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no CUDA GPU here" in proc.stderr and "--dry-run" in proc.stderr
