"""slow_collective in words: which op, how many bytes, how long the transfer takes on every rank
and what share of the step, the bandwidth achieved (NCCL-tests' algorithm and bus bandwidth),
that no rank is to blame, and the job's levers: the network first."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.slow_collective import Facts, OpTransfer
from auditor.analysis.stats import is_object_op
from auditor.wording import fmt_bytes, fmt_ms, fmt_pct

from .words import Phrase, phrase_facts

SPEEDUP_NOTE = (
    "not predicted: what a fix wins depends on the link it reaches (the NIC NCCL uses, its "
    "speed), which the auditor does not measure"
)


def fmt_gbps(bytes_per_s: float | None) -> str:
    """``1.23 GB/s`` (decimal, as NCCL-tests and NIC ratings give it)."""
    if bytes_per_s is None:
        return "unknown"
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def op_text(o: OpTransfer) -> str:
    """``all_gather of 64.0 MiB a step: 41 ms of transfer (35% of the step), 1.6 GB/s algorithm,
    0.8 GB/s bus bandwidth``."""
    size = f" of {fmt_bytes(o.nbytes)} a step" if o.nbytes else ""
    bw = (
        f", {fmt_gbps(o.algbw)} algorithm / {fmt_gbps(o.busbw)} bus bandwidth"
        if o.algbw is not None
        else ", bytes not known (objects or a barrier): no bandwidth"
    )
    since = f" since step {o.since_step}" if o.since_step is not None else ""
    return (
        f"{o.op}{size}{since}: {fmt_ms(o.transfer_s)} of transfer "
        f"({fmt_pct(o.share)} of the step){bw}"
    )


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    first = facts.ops[0]
    where = "on one host" if facts.same_host else "across hosts"
    summary = (
        f"the collectives themselves take {fmt_pct(facts.share)} of every rank's step "
        f"({facts.ranks} ranks {where}): {op_text(first)}"
    )
    if len(facts.ops) > 1:
        summary += "; also " + "; ".join(op_text(o) for o in facts.ops[1:])
    summary += "; every rank pays it after the last one arrives, so no rank is to blame"
    return Phrase(summary, notes={"speedup_model": SPEEDUP_NOTE, "fix": _fix(facts)})


def _fix(facts: Facts) -> str:
    op = facts.ops[0].op
    if is_object_op(op):
        return (
            f"{op} pickles every rank's object and unpickles all of them on every rank: gather "
            "tensors instead (all_gather_into_tensor), fewer or smaller objects, or less often"
        )
    network = (
        "check the network the collectives use: with NCCL, NCCL_DEBUG=INFO names the transport "
        "(NET/Socket on a management NIC is the usual fallback); set NCCL_SOCKET_IFNAME / "
        "NCCL_IB_HCA to the fast interface"
    )
    if facts.same_host:
        network = (
            "check the transport between the GPUs of this host (nvidia-smi topo -m; with NCCL, "
            "NCCL_DEBUG=INFO: P2P/NVLink, not SHM or Socket)"
        )
    if not facts.on_gpu:
        # gloo on the CPU: one host's ranks reduce through its memory and loopback, which no
        # setting speeds up; across hosts gloo takes the interface its hostname resolves to.
        network = (
            ""
            if facts.same_host
            else "check the interface gloo uses (GLOO_SOCKET_IFNAME set to the fast one)"
        )
    if op == "ddp_allreduce":
        rest = (
            "overlap more of the gradient all-reduce with backward (DDP bucket_cap_mb), or "
            "compress it (register_comm_hook with bf16_compress_hook / PowerSGD)"
        )
    else:
        rest = (
            f"call {op} less often or on less data (gather metrics every N steps, coalesce "
            "small tensors), or overlap it with compute (async_op=True, wait later)"
        )
    return f"{network}; {rest}" if network else rest
