"""The endpoint of one ``auditor run``, served by the process that judges the job.

The driver already receives every sample of its node (the node agent's drains) and judges the
job, so it keeps the export state itself: this node's ranks, host and GPUs folded in with the one
update path (:func:`auditor.metrics.state.apply_batch`), and the findings set the moment they are
judged. No verdict travels back to the agent to be exported, and a scrape never shows findings
older than the verdict the terminal shows. (``auditor fleet``'s node agents keep an endpoint of
their own: they judge nothing.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from auditor.analysis.findings import Finding
from auditor.analysis.mfu import job_mfu, rank_flops
from auditor.analysis.snapshot import Snapshot
from auditor.metrics.exporter import make_registry, serve, stop
from auditor.metrics.state import ExportState, GpuStatus, apply_batch, with_work
from auditor.samples import Batch


class RunEndpoint:
    """``/metrics`` of one run on ``host:port`` (0: any free port); binds at construction, so a
    port that is taken raises :class:`OSError` before anything else starts."""

    def __init__(self, job: str, node: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = ExportState(job=job, node=node)
        self.host = host
        self._server, self.port = serve(make_registry(lambda: self.state), host=host, port=port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def set_node(self, node: str) -> None:
        """The node label, once the agent has said which node it runs on."""
        self.state = dataclasses.replace(self.state, node=node)

    def add(self, batch: Batch) -> None:
        """This node's samples (never another node's: each node exports its own ranks)."""
        self.state = apply_batch(self.state, batch)

    def set_gpus(self, gpus: Mapping[str, Mapping[str, Any]]) -> None:
        """Each GPU's identity and whether its monitor answered, as the agent reports them
        (``NodeAgentCore.gpus``): a GPU whose monitor stopped answering is exported as down,
        with no values, rather than frozen at its last sample."""
        current = self.state.gpus
        for uuid, g in gpus.items():
            old = current.get(uuid)
            current[uuid] = GpuStatus(
                index=int(g["index"]),
                uuid=uuid,
                model=str(g.get("model") or (old.model if old else "")),
                sample=old.sample if old is not None else None,
                up=bool(g.get("up")) and old is not None and old.sample is not None,
            )

    def set_findings(self, findings: Sequence[Finding]) -> None:
        self.state.findings[:] = list(findings)

    def set_work(self, snapshot: Snapshot) -> None:
        """The counted work of the snapshot a verdict judged: each rank's FLOPs per step,
        FLOP/s and MFU and the job's MFU (:mod:`auditor.analysis.mfu`), exported until the next
        verdict. This node's ranks only (the others are their nodes' to export); the job's MFU
        is the job's, the same on every node."""
        flops = rank_flops(snapshot)
        self.state = with_work(self.state, flops, job_mfu(snapshot, flops=flops) if flops else None)

    def close(self) -> None:
        stop(self._server)
