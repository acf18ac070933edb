"""FLOPs per step end to end: real two-rank jobs on CPU under ``auditor run --no-ray --record``,
whose recording holds each rank's count, within 1% of the count worked out for its model.

* a plain DDP loop over gloo (``tests/probe/scripts/flops.py``: a Linear stack, 2 micro-batches
  per step): against the count by hand;
* Lightning (``examples/frameworks/lightning_ddp.py``: ``Linear(64, 256) - ReLU -
  Linear(256, 4)``, forward and backward inside ``optimizer.step(closure)``, 2 micro-batches):
  by hand;
* the Hugging Face ``Trainer`` (``examples/frameworks/hf_trainer.py``: a tiny GPT-2 from a
  config, ``model(**batch)``, 2 micro-batches): against ``FlopCounterMode`` run here on the
  same model and batch.

The counted steps are flagged in the recording and nowhere else.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.samples import FlopCount
from auditor.telemetry.recorded import Recording, read_recording

from .conftest import REPO, base_env

pytestmark = pytest.mark.e2e

FRAMEWORKS = REPO / "examples" / "frameworks"
SCRIPT = REPO / "tests" / "probe" / "scripts" / "flops.py"
BATCH = 8  # examples/frameworks/workload.py
ACCUMULATE = 2


def record(tmp: Path, command: list[str], timeout: float = 300) -> Recording:
    rec = tmp / "run.jsonl"
    argv = [sys.executable, "-m", "auditor", "run", "--no-ray", "--quiet", "--record", str(rec)]
    env = base_env()
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [*argv, "--", *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return read_recording(rec)


def counts(rec: Recording) -> dict[int, FlopCount]:
    """Each rank's first count (a count may be resent on a new connection)."""
    out: dict[int, FlopCount] = {}
    for c in sorted(rec.batch.flops, key=lambda c: c.time):
        out.setdefault(c.rank, c)
    return out


def check(rec: Recording, exact: float) -> None:
    by_rank = counts(rec)
    assert sorted(by_rank) == [0, 1], rec.batch.flops
    for rank, c in by_rank.items():
        assert abs(c.flops - exact) <= 0.01 * exact, (rank, c.flops, exact)
        assert c.micro_batches == ACCUMULATE and c.samples == ACCUMULATE * BATCH, c
        assert c.device == "cpu" and c.by_dtype == {"fp32": c.flops}, c
        assert c.cost_s is not None and c.cost_s >= 0.0, c
        flagged = [s.step for s in rec.batch.steps if s.rank == rank and s.flops_counted]
        assert flagged == [c.step], (rank, flagged, c.step)


def mlp_flops(batch: int, dims: tuple[int, ...]) -> int:
    """Forward, weight gradients, and input gradients past the first layer, by hand."""
    pairs = list(itertools.pairwise(dims))
    forward = sum(2 * batch * i * o for i, o in pairs)
    return 2 * forward + sum(2 * batch * i * o for i, o in pairs[1:])


def test_plain_ddp_loop(tmp_path: Path) -> None:
    rec = record(
        tmp_path,
        ["torchrun", "--nproc_per_node=2", str(SCRIPT), "--ddp", "--batch", str(BATCH),
         "--accumulate", str(ACCUMULATE), "--steps", "10"],
    )  # fmt: skip
    check(rec, ACCUMULATE * mlp_flops(BATCH, (64, 128, 10)))


def test_lightning(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    rec = record(
        tmp_path,
        [sys.executable, str(FRAMEWORKS / "lightning_ddp.py"), "--strategy", "ddp",
         "--fault", "none", "--steps", "10", "--accumulate", str(ACCUMULATE)],
    )  # fmt: skip
    check(rec, ACCUMULATE * mlp_flops(BATCH, (64, 256, 4)))


def test_hf_trainer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    rec = record(
        tmp_path,
        ["torchrun", "--nproc_per_node=2", str(FRAMEWORKS / "hf_trainer.py"),
         "--fault", "none", "--steps", "10", "--accumulate", str(ACCUMULATE)],
    )  # fmt: skip
    seq = 32  # hf_trainer.py's SEQ and model config
    config = transformers.GPT2Config(
        vocab_size=128, n_positions=seq, n_embd=32, n_layer=2, n_head=2
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (BATCH, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    check(rec, ACCUMULATE * counter.get_total_flops())
