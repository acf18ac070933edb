"""idle_device: a GPU whose memory is held while it computes nothing.

Metric, per GPU (NVML): the median utilisation over the window, the processes NVML lists on it
and the memory in use. Decision: the median utilisation is at most ``max_util`` while memory is
held: a process is listed, or the memory in use is at least ``min_mem_bytes`` (NVML may not list
processes inside containers). A GPU needs ``min_samples`` samples in the window; one whose
utilisation could not be read is not judged (unknown is not idle), and a GPU that fell off the
bus is lost, not idle.

While a job's ranks report steps, at least one of them needs ``min_steps`` steps in the window:
memory allocated before the first step (model loading, compilation) is not an idle GPU. Without
any rank (an operator's node-only view) the GPUs are judged alone.

Blamed: the ranks that own the GPU (:func:`auditor.analysis.devices.gpu_owners`), else ranks of
the job with a stray process on it; otherwise no rank (``ranks=()``): the GPU and the PIDs are
named in the evidence and the summary, with the fix under ``evidence["fix"]``.

Speed-up: not predicted. Nothing in the job waits for an idle GPU; freeing it gives its memory,
and the GPU itself, to work that uses it. One finding per idle GPU, ``warning``.
"""

from __future__ import annotations

from ..devices import GIB, DeviceStats, fmt_gib
from ..findings import Finding
from ..snapshot import Snapshot

SPEEDUP_NOTE = "not predicted: nothing in the job waits for an idle GPU"


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_samples: int = 5,
    max_util: float = 0.02,
    min_mem_bytes: int = GIB,
) -> list[Finding]:
    """Find GPUs that hold memory and compute nothing.

    Args:
        min_steps: while ranks report steps, one needs this many in the window first.
        min_samples: NVML samples a GPU needs in the window before it is judged.
        max_util: median utilisation (0..1) at or below which a GPU counts as idle.
        min_mem_bytes: memory in use that counts as held where NVML lists no process.
    """
    steps = [v.step_count for v in snapshot.ranks]
    if snapshot.ranks and max(steps, default=0) < min_steps:
        return []
    owners = snapshot.owners
    strays = snapshot.strays
    findings: list[Finding] = []
    stats = snapshot.gpu_stats
    for uuid, d in sorted(stats.items(), key=lambda kv: (kv[1].node, kv[1].index)):
        if d.lost or d.samples < min_samples or d.gpu_util is None or d.gpu_util > max_util:
            continue
        used = d.mem_used_bytes
        if not d.processes and (used is None or used < min_mem_bytes):
            continue
        known = [p.used_bytes for p in d.processes if p.used_bytes is not None]
        held = float(sum(known)) if known else used
        ranks = tuple(owners.get(uuid, ())) or tuple(sorted(strays.get(uuid, {})))
        findings.append(_finding(d, ranks, held))
    return findings


def _finding(d: DeviceStats, ranks: tuple[int, ...], held: float | None) -> Finding:
    pids = ", ".join(str(p) for p in d.pids) or "unlisted processes"
    busy = f"busy {(d.gpu_util or 0.0):.0%} over {d.span_s:.0f} s"
    if ranks:
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
        fix = (
            f"free it: the process holds {fmt_gib(held)} on {d.label} ({busy}) and never "
            f"computes there; if the rank should use this GPU check CUDA_VISIBLE_DEVICES and "
            "call torch.cuda.set_device(local_rank) first, otherwise stop allocating on it"
        )
        summary = f"{who} hold{'s' if len(ranks) == 1 else ''} {fmt_gib(held)} on idle {d.label}"
        fixes = {r: fix for r in ranks}
    else:
        one = len(d.pids) <= 1
        if not d.pids:  # NVML listed none (containers), or the figures came from Prometheus
            procs = "processes outside this job hold"
        else:
            procs = f"PID {pids} holds" if one else f"PIDs {pids} hold"
        kill = " ".join(str(p) for p in d.pids) or "<pid>"
        fix = (
            f"free it: {procs} {fmt_gib(held)} on idle {d.label} ({busy}), outside this job; "
            f"stop {'it' if one else 'them'} on {d.node or 'the node'} (`kill {kill}`) or give "
            "the GPU to a job that uses it"
        )
        summary = f"{procs} {fmt_gib(held)} on idle {d.label} (no rank of this job)"
        fixes = {}
    return Finding(
        kind="idle_device",
        severity="warning",
        ranks=ranks,
        summary=summary,
        evidence={
            "gpus": [d.ref],
            "gpu_util": None if d.gpu_util is None else round(d.gpu_util, 3),
            "held_bytes": None if held is None else round(held),
            "mem_used_bytes": None if d.mem_used_bytes is None else round(d.mem_used_bytes),
            "mem_total_bytes": d.mem_total_bytes,
            "pids": list(d.pids),
            "processes": {str(p.pid): p.used_bytes for p in d.processes},
            "window_s": round(d.span_s, 1),
            "samples": d.samples,
            "fix": fix,
            "speedup_model": SPEEDUP_NOTE,
        },
        fixes=fixes,
        predicted_speedup=None,
    )
