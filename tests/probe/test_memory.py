"""The memory budget on real two-rank jobs (torchrun, gloo, CPU): a known MLP, three optimizers,
a rank that keeps an extra copy of the model, and FSDP2.

The MLP (``scripts/memory.py``) is ``Linear(IN, HID) - ReLU - Linear(HID, HID) - ReLU -
Linear(HID, OUT)`` in float32, so what each rank holds is known in closed form:

* parameters: ``P = 4 * (IN*HID + HID + HID*HID + HID + HID*OUT + OUT)`` bytes; gradients P;
* optimizer state: Adam ``exp_avg`` P and ``exp_avg_sq`` P (x4 in all with parameters and
  gradients) plus one 0-dim float32 ``step`` per parameter tensor (6 x 4 bytes: counted, as its
  own kind); SGD with momentum ``momentum_buffer`` P (x3); plain SGD nothing (x2);
* activations per sample: autograd keeps the input (the first weight needs its gradient) and
  each ReLU's output (which the next Linear saves too: one storage): ``4 * (IN + 2 * HID)``;
  the weights saved for backward are parameters, not activations.
"""

from __future__ import annotations

import pytest

from auditor.analysis.engine import analyze
from auditor.analysis.snapshot import SampleStore
from auditor.report.json_report import build_report
from auditor.samples import Batch, MemoryBudget
from tests.helpers.exits import ended_well, failure_text

from . import SCRIPTS, Job, JobResult, free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

IN, HID, OUT, BATCH = 64, 512, 10, 32
P = 4 * (IN * HID + HID + HID * HID + HID + HID * OUT + OUT)
TENSORS = 6
ACT_PER_SAMPLE = 4 * (IN + 2 * HID)
JOBS = {
    "adam": ["--optim", "adam", "--copy-rank", "1"],
    "sgdm": ["--optim", "sgdm"],
    "sgd": ["--optim", "sgd"],
    "fsdp": ["--optim", "adam", "--fsdp"],
}


@pytest.fixture(scope="module")
def jobs() -> dict[str, JobResult]:
    started = {}
    for name, extra in JOBS.items():
        argv = [
            "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(free_port()),
            str(SCRIPTS / "memory.py"), "--batch", str(BATCH), *extra,
        ]  # fmt: skip
        started[name] = Job(argv, env={"AUDITOR_EXIT_WAIT_S": "10"})
    out = {}
    for name, job in started.items():
        res = job.result(timeout=240, wait_rank_s=20, ranks=2)
        finished = res.stdout.count("DONE=1") == 2  # after destroy_process_group
        assert ended_well(res.returncode, res.stderr, finished=finished), (
            f"{name}: rc {res.returncode}\n{failure_text(res.stderr)}"
        )
        out[name] = res
    return out


def latest(res: JobResult) -> dict[int, MemoryBudget]:
    """Each rank's newest budget that carries an activation sample."""
    out: dict[int, MemoryBudget] = {}
    for m in sorted(res.memory, key=lambda m: m.time):
        out[m.rank] = m
    assert sorted(out) == [0, 1], f"budgets from ranks {sorted(out)}"
    for r, m in out.items():
        assert m.activation_bytes is not None, f"rank {r}: no activation sample"
    return out


def store_of(res: JobResult) -> SampleStore:
    store = SampleStore("memory")
    store.add(
        Batch(infos=tuple(res.infos.values()), steps=tuple(res.steps), memory=tuple(res.memory))
    )
    return store


def test_adam_budget_is_exact(jobs: dict[str, JobResult]) -> None:
    for r, m in latest(jobs["adam"]).items():
        assert m.param_bytes == P, r
        assert m.param_bytes_by_dtype == {"float32": P}
        assert m.param_count == TENSORS
        assert m.grad_bytes == P
        assert m.optimizer == "Adam"
        assert m.optimizer_bytes_by_kind == {"exp_avg": P, "exp_avg_sq": P, "step": 4 * TENSORS}
        assert m.buffer_bytes == 0
        # x4: parameters, gradients, exp_avg, exp_avg_sq (the step counters apart)
        assert m.fixed_bytes == 4 * P + 4 * TENSORS
        assert m.sharded is False
        assert m.device == "cpu" and m.device_total_bytes is None
        assert m.host_total_bytes and m.host_available_bytes and m.local_ranks == 2


def test_activations_per_sample(jobs: dict[str, JobResult]) -> None:
    for name in ("adam", "sgdm", "sgd", "fsdp"):
        for r, m in latest(jobs[name]).items():
            assert m.activation_batch == BATCH
            per = m.activations_per_sample
            assert per == pytest.approx(ACT_PER_SAMPLE, rel=0.10), (name, r, per)


def test_sgd_with_momentum_keeps_one_copy(jobs: dict[str, JobResult]) -> None:
    for m in latest(jobs["sgdm"]).values():
        assert (m.param_bytes, m.grad_bytes) == (P, P)
        assert m.optimizer_bytes_by_kind == {"momentum_buffer": P}
        assert m.fixed_bytes == 3 * P


def test_plain_sgd_keeps_no_state(jobs: dict[str, JobResult]) -> None:
    for m in latest(jobs["sgd"]).values():
        assert (m.param_bytes, m.grad_bytes, m.optimizer_bytes) == (P, P, 0)
        assert m.optimizer_bytes_by_kind == {}
        assert m.fixed_bytes == 2 * P


def test_extra_copy_is_found_on_its_rank(jobs: dict[str, JobResult]) -> None:
    budgets = latest(jobs["adam"])
    assert budgets[0].other_module_bytes == 0
    assert budgets[1].other_module_bytes == P  # the EMA copy's parameters
    snap = store_of(jobs["adam"]).snapshot(now=float("inf"), window_s=None)
    found = [f for f in analyze(snap) if f.kind == "memory_imbalance"]
    assert [f.ranks for f in found] == [(1,)]
    f = found[0]
    assert f.evidence["extra_by_part"] == {"other_module_bytes": P}
    assert f.evidence["extra_bytes"] == P
    assert f.severity == "info"  # a CPU job with memory to spare


def test_fsdp2_state_is_per_shard(jobs: dict[str, JobResult]) -> None:
    # Every dimension 0 here is even: each rank holds exactly half of every tensor.
    for r, m in latest(jobs["fsdp"]).items():
        assert m.sharded is True, r
        assert m.param_bytes == P // 2
        assert m.grad_bytes == P // 2
        assert m.optimizer_bytes_by_kind == {
            "exp_avg": P // 2,
            "exp_avg_sq": P // 2,
            "step": 4 * TENSORS,
        }


def test_report_and_rules_carry_the_budget(jobs: dict[str, JobResult]) -> None:
    snap = store_of(jobs["sgd"]).snapshot(now=float("inf"), window_s=None)
    findings = analyze(snap)
    report = build_report(
        command=["train"], exit_code=0, duration_s=1.0, snapshot=snap, findings=findings
    )
    assert [entry["rank"] for entry in report["ranks"]] == [0, 1]
    for entry in report["ranks"]:
        b = entry["memory"]["budget"]
        assert b["param_bytes"] == P and b["grad_bytes"] == P and b["optimizer_bytes"] == 0
        assert b["fixed_bytes"] == 2 * P
        assert b["activation_bytes_per_step"] == ACT_PER_SAMPLE * BATCH
        assert b["activation_bytes_per_sample"] == pytest.approx(ACT_PER_SAMPLE)
        assert b["host_total_bytes"] > 0
    # A CPU job with memory to spare: the largest batch that fits is said, as info only.
    assert all(f.severity == "info" for f in findings if f.kind.startswith("memory_"))
    room = [f for f in findings if f.kind == "memory_headroom"]
    assert room and set(room[0].ranks) == {0, 1}
    row = room[0].evidence["per_rank"]["0"]
    assert row["largest_batch"] > BATCH
    assert row["levers"]["checkpointing"]["frees_bytes"] == round(0.75 * ACT_PER_SAMPLE * BATCH)
    assert "sgd" not in row["levers"]  # plain SGD has no state to give up
