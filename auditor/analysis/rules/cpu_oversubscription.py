"""cpu_oversubscription: more busy processes than the host has cores.

Metric: per host, the measured CPU of every rank's main process and of each of its DataLoader
workers (psutil, in cores), and the host's busy cores. Decision: the host is at least
``min_host_busy`` busy and runs more busy processes (those above ``busy_proc_cpu`` cores) than it
has cores. Extra workers then only take CPU from the training loops and from each other.

Blamed: ranks whose worker count exceeds their fair share of the cores the main processes leave
free: ``fair = floor(free / ranks_on_host / cpu_per_worker)``, at least 1. The fix lowers
``num_workers`` to that share and never raises it.

Predicted speed-up: with ``n`` CPU-bound runnable processes on ``c`` cores each gets ``c / n`` of a
core, so trimming the busy workers to fit gives about ``n / max(c, n')`` (bounded by 2x; this is the
roughest of the estimates and says so in the evidence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..findings import Finding, severity_for
from ..snapshot import Snapshot
from .common import ranks_text, ready, with_expectation


def detect(
    snapshot: Snapshot,
    *,
    prior: Sequence[Finding] = (),
    min_steps: int = 8,
    min_host_busy: float = 0.85,
    busy_proc_cpu: float = 0.25,
    min_samples: int = 3,
) -> list[Finding]:
    """Find hosts with more busy training processes than cores.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_host_busy: share of the host's cores in use that counts as saturated.
        busy_proc_cpu: CPU (cores) above which a process counts as busy.
        min_samples: host CPU samples needed in the window.
    """
    stats = ready(snapshot.stats, min_steps)
    findings: list[Finding] = []
    for host, ranks in sorted(snapshot.hosts().items()):
        node_samples = [n for n in snapshot.nodes if n.host == host]
        rs = [r for r in ranks if r in stats]
        if len(node_samples) < min_samples or not rs:
            continue
        cores = node_samples[-1].cores
        busy_cores = sum(n.busy_cores for n in node_samples) / len(node_samples)
        if busy_cores < min_host_busy * cores:
            continue
        mains = {r: stats[r].main_cpu or 0.0 for r in rs}
        worker_each = {r: stats[r].worker_cpu_each or 0.0 for r in rs}
        workers = {r: stats[r].workers for r in rs}
        busy_procs = sum(1 for r in rs if mains[r] >= busy_proc_cpu) + sum(
            workers[r] for r in rs if worker_each[r] >= busy_proc_cpu
        )
        if busy_procs <= cores:
            continue
        free = max(0.0, cores - sum(mains.values()))
        fair: dict[int, int] = {}
        for r in rs:
            each = max(worker_each[r], busy_proc_cpu)
            fair[r] = max(1, math.floor(free / len(rs) / each))
        blamed = sorted(r for r in rs if workers[r] > fair[r] and worker_each[r] >= busy_proc_cpu)
        if not blamed:
            continue
        after = sum(1 for r in rs if mains[r] >= busy_proc_cpu) + sum(
            (fair[r] if r in blamed else workers[r]) for r in rs if worker_each[r] >= busy_proc_cpu
        )
        speedup = min(2.0, busy_procs / max(cores, after))
        speedup = max(1.0, speedup)
        fixes = {
            r: with_expectation(
                f"num_workers {workers[r]} -> {min(workers[r] - 1, fair[r])} "
                f"(each worker uses {worker_each[r]:.2f} cores; {cores:g} cores on {host or 'host'})",
                speedup,
            )
            for r in blamed
        }
        summary = (
            f"{host or 'host'} runs {busy_procs} busy processes on {cores:g} cores: "
            f"{ranks_text(blamed)} start{'s' if len(blamed) == 1 else ''} more DataLoader "
            "workers than there are free cores"
        )
        evidence = {
            "host": host,
            "cores": cores,
            "busy_cores": round(busy_cores, 2),
            "busy_processes": busy_procs,
            "main_cpu": {str(r): round(v, 2) for r, v in sorted(mains.items())},
            "workers": {str(r): v for r, v in sorted(workers.items())},
            "worker_cpu_each": {str(r): round(v, 2) for r, v in sorted(worker_each.items())},
            "fair_workers": {str(r): v for r, v in sorted(fair.items())},
            "speedup_model": "runnable processes / cores (rough)",
        }
        findings.append(
            Finding(
                kind="cpu_oversubscription",
                severity=severity_for(speedup),
                ranks=tuple(blamed),
                summary=summary,
                evidence=evidence,
                fixes=fixes,
                predicted_speedup=speedup,
            )
        )
    return findings
