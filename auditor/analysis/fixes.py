"""A fix as data: the lever to move on one rank (or GPU), from what to what, and what it buys.

Rules hand their fixes over typed (:class:`Fix`), next to their facts; the report words them
(:mod:`auditor.report.phrasing`) and the JSON report carries them as they are, so a fix can be
read back, compared with what it achieved, and applied where the lever is a loader setting
(:data:`LOADER_LEVERS`). Every lever a rule may name is declared once in :data:`LEVERS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Value = int | float | bool | str | None

# How a lever is moved: a DataLoader argument the probe can set when the loader is built
# (``loader``), a change to the training script or its launch (``code``), or to the machine
# (``hardware``). Only ``loader`` levers can be applied without editing the script.
LOADER = "loader"
CODE = "code"
HARDWARE = "hardware"

LEVERS: Mapping[str, str] = {
    # DataLoader arguments
    "num_workers": LOADER,
    "pin_memory": LOADER,
    "persistent_workers": LOADER,
    "prefetch_factor": LOADER,
    # the script
    "batch_size": CODE,
    "loss_weight": CODE,  # a rank's loss scaled by its share of the global batch (uneven split)
    "loading_cost": CODE,  # cheaper decoding / transforms / faster reads
    "rank_work": CODE,  # work one rank does that its peers do not
    "gradient_checkpointing": CODE,
    "autocast_bf16": CODE,
    "tf32": CODE,  # TF32 for fp32 matmuls (torch.backends.cuda.matmul.allow_tf32)
    "bf16_params": CODE,
    "optimizer": CODE,
    "sharding": CODE,
    "parallel_mode": CODE,  # DataParallel -> DistributedDataParallel
    "output_device": CODE,  # where DataParallel gathers its outputs
    "memory_release": CODE,  # a rank keeping tensors its peers free
    "stray_process": CODE,  # a process on a GPU it does not own
    "gpu_assignment": CODE,  # which GPU a rank or a process uses
    "scatter_chunks": CODE,  # DataParallel's per-GPU chunks of the batch (the primary's smaller)
    "retained_tensors": CODE,  # tensors kept across steps (a loss summed as a tensor, a list)
    "allocator_config": CODE,  # PYTORCH_CUDA_ALLOC_CONF (expandable_segments:True), set at launch
    # a rank's own work between its steps that its peers wait for (stall)
    "checkpoint_async": CODE,  # save off the training step (async_save, a background thread)
    "checkpoint_interval": CODE,  # steps between checkpoints
    "evaluation_on_all_ranks": CODE,  # evaluation sharded over every rank, not one rank's alone
    "logging_off_step": CODE,  # logging and metric gathering off the step (less often, async)
    # the job's collectives themselves (slow_collective): the network NCCL uses
    # (NCCL_SOCKET_IFNAME, NCCL_IB_HCA: not TCP on a management NIC), DDP's gradient buckets
    # (bucket_cap_mb), a compression comm hook, overlap of the transfer with compute, fewer
    # collectives a step (metrics gathered less often, coalesced)
    "collective_network": CODE,
    "bucket_cap_mb": CODE,
    "comm_hook": CODE,
    "collective_overlap": CODE,
    "fewer_collectives": CODE,
    # the machine
    "device": HARDWARE,  # a throttled or slower GPU: cooling, power, clocks, replacement
    "power_limit": HARDWARE,  # a GPU's power limit in watts (nvidia-smi -pl)
    "host_memory": HARDWARE,
    "host_cores": HARDWARE,  # a rank's process waits for a core: the host's CPU is short
}
LOADER_LEVERS = frozenset(k for k, v in LEVERS.items() if v == LOADER)


@dataclass(frozen=True)
class Fix:
    """One change: ``lever`` on ``rank`` (None: a GPU no rank owns, named by ``gpu``) from
    ``current`` to ``proposed`` (None where not known or not a value: "remove the rank's extra
    work"), the job's expected speed-up once the finding's fixes are applied (None where not
    predicted), and the finding kinds it answers."""

    lever: str
    rank: int | None = None
    current: Value = None
    proposed: Value = None
    speedup: float | None = None
    answers: tuple[str, ...] = ()
    gpu: str | None = None

    def __post_init__(self) -> None:
        if self.lever not in LEVERS:
            raise ValueError(f"unknown lever {self.lever!r}")

    @property
    def how(self) -> str:
        """``loader``, ``code`` or ``hardware``: how the lever is moved."""
        return LEVERS[self.lever]

    @property
    def applicable(self) -> bool:
        """Whether the probe can apply it when the loader is built (no script change)."""
        return self.lever in LOADER_LEVERS

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "gpu": self.gpu,
            "lever": self.lever,
            "how": self.how,
            "current": self.current,
            "proposed": self.proposed,
            "expected_speedup": None if self.speedup is None else round(self.speedup, 3),
            "answers": list(self.answers),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fix | None:
        """The fix a report holds; None where it names a lever this version does not know."""
        lever = d.get("lever")
        if not isinstance(lever, str) or lever not in LEVERS:
            return None
        rank = d.get("rank")
        speedup = d.get("expected_speedup")
        return cls(
            lever=lever,
            rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            current=_value(d.get("current")),
            proposed=_value(d.get("proposed")),
            speedup=(
                float(speedup)
                if isinstance(speedup, (int, float)) and not isinstance(speedup, bool)
                else None
            ),
            answers=tuple(str(a) for a in d.get("answers") or ()),
            gpu=d.get("gpu") if isinstance(d.get("gpu"), str) else None,
        )


def _value(v: object) -> Value:
    return v if isinstance(v, (int, float, bool, str)) or v is None else str(v)
