"""What a launch command says about the job it starts: torchrun's own options, parsed once.

Used by the job view (a multi-node job's rendezvous, which names it, and each node's rank in it)
and the live view (how many ranks to wait for). Pure: a command line in, options out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def torchrun_args(command: Sequence[str]) -> dict[str, str] | None:
    """torchrun's own options (before the script) as ``{name: value}`` with ``_`` spelling, or
    None when ``command`` is not a torchrun launch."""
    cmd = list(command)
    start = None
    for i, arg in enumerate(cmd):
        base = os.path.basename(arg)
        if base == "torchrun":
            start = i + 1
            break
        if arg == "-m" and i + 1 < len(cmd) and cmd[i + 1] in _TORCHRUN_MODULES:
            start = i + 2
            break
    if start is None:
        return None
    out: dict[str, str] = {}
    i = start
    while i < len(cmd):
        arg = cmd[i]
        if not arg.startswith("-"):
            break  # the training script: its own arguments follow
        name, eq, value = arg.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if eq:
            out[name] = value
        elif i + 1 < len(cmd) and not cmd[i + 1].startswith("-") and name not in _FLAGS:
            out[name] = cmd[i + 1]
            i += 1
        else:
            out[name] = ""
        i += 1
    return out


# torchrun options that take no value (the rest do).
_FLAGS = frozenset({"standalone", "no_python", "run_path", "module", "m", "tee_all"})


def expected_ranks(command: Sequence[str]) -> int | None:
    """The ranks a torchrun command starts (``--nproc_per_node`` x ``--nnodes``), if it says
    (``--nnodes=1:4``, elastic, is no count; ``--nproc_per_node=gpu`` neither)."""
    opts = torchrun_args(command)
    if opts is None:
        return None
    try:
        per_node = int(opts.get("nproc_per_node") or "1")
        nodes = int(opts.get("nnodes") or "1")
    except ValueError:
        return None
    return per_node * nodes


# Where a node's place in a job spanning nodes is read when torchrun's command line does not
# say it (``--node_rank``): torchrun's own environment twin; GROUP_RANK, what torchrun hands
# its workers (an auditor run inside a process an outer torchrun started); the launchers'
# equivalents (Lightning's and accelerate's NODE_RANK, SLURM's node index).
NODE_RANK_ENV = ("PET_NODE_RANK", "GROUP_RANK", "NODE_RANK", "SLURM_NODEID")


def node_rank(command: Sequence[str], env: Mapping[str, str]) -> int | None:
    """This node's rank among the job's nodes, where the launch says it: torchrun's
    ``--node_rank`` (``--node-rank``), else the first of :data:`NODE_RANK_ENV` set. None when
    nothing says (torchrun's dynamic rendezvous assigns it only once every node has come)."""
    opts = torchrun_args(command) or {}
    for raw in (opts.get("node_rank"), *(env.get(name) for name in NODE_RANK_ENV)):
        if raw is not None and raw.strip().isdigit():
            return int(raw)
    return None
