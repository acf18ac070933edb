"""What a launch command says about the job it starts: torchrun's own options (and the DeepSpeed
launcher's), parsed once.

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
    return _options(cmd, start, _FLAGS)


def _options(
    cmd: Sequence[str], start: int, flags: frozenset[str], short: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A launcher's options from ``cmd[start]`` up to the script, ``{name: value}`` with ``_``
    spelling; ``flags`` take no value; ``short``: one-letter names' long ones."""
    out: dict[str, str] = {}
    i = start
    while i < len(cmd):
        arg = cmd[i]
        if not arg.startswith("-"):
            break  # the training script: its own arguments follow
        name, eq, value = arg.lstrip("-").partition("=")
        name = name.replace("-", "_")
        name = (short or {}).get(name, name)
        if eq:
            out[name] = value
        elif i + 1 < len(cmd) and not cmd[i + 1].startswith("-") and name not in flags:
            out[name] = cmd[i + 1]
            i += 1
        else:
            out[name] = ""
        i += 1
    return out


# torchrun options that take no value (the rest do).
_FLAGS = frozenset({"standalone", "no_python", "run_path", "module", "m", "tee_all"})

# The DeepSpeed launcher: its program and module, its options that take no value, and its
# one-letter options.
_DEEPSPEED_PROGRAMS = ("deepspeed",)
_DEEPSPEED_MODULES = ("deepspeed.launcher.runner",)
_DEEPSPEED_FLAGS = frozenset(
    {
        "module",
        "no_python",
        "no_local_rank",
        "no_ssh",
        "no_ssh_check",
        "force_multi",
        "save_pid",
        "bind_cores_to_rank",
        "quiet",
        "q",
    }
)
_DEEPSPEED_SHORT = {"H": "hostfile", "i": "include", "e": "exclude"}


def deepspeed_args(command: Sequence[str]) -> dict[str, str] | None:
    """The DeepSpeed launcher's own options (before the script) as ``{name: value}``, or None
    when ``command`` is not a ``deepspeed`` launch."""
    cmd = list(command)
    for i, arg in enumerate(cmd):
        if os.path.basename(arg) in _DEEPSPEED_PROGRAMS:
            return _options(cmd, i + 1, _DEEPSPEED_FLAGS, _DEEPSPEED_SHORT)
        if arg == "-m" and i + 1 < len(cmd) and cmd[i + 1] in _DEEPSPEED_MODULES:
            return _options(cmd, i + 2, _DEEPSPEED_FLAGS, _DEEPSPEED_SHORT)
    return None


def deepspeed_ranks(opts: Mapping[str, str]) -> int | None:
    """The ranks a DeepSpeed launch starts, where its options say: the slots ``--include``
    lists (``host:0,1@host2:0``; a host without slots is all of its GPUs: no count), else
    ``--num_gpus`` (``--num_accelerators``) per node times ``--num_nodes``, or one node when no
    hostfile is named (the launcher then runs on this machine alone). None: it depends on the
    machine (its GPU count, a hostfile's slots, ``--exclude``)."""
    include = opts.get("include")
    if include:
        total = 0
        for spec in include.split("@"):
            _host, colon, slots = spec.partition(":")
            listed = [s for s in slots.split(",") if s.strip()]
            if not colon or not listed:
                return None
            total += len(listed)
        return total
    if opts.get("exclude"):
        return None
    try:
        gpus = int(opts.get("num_gpus") or opts.get("num_accelerators") or "-1")
        nodes = int(opts.get("num_nodes") or "-1")
    except ValueError:
        return None
    if gpus <= 0:
        return None
    if nodes > 0:
        return gpus * nodes
    return None if opts.get("hostfile") else gpus


def expected_ranks(command: Sequence[str]) -> int | None:
    """The ranks a torchrun command starts (``--nproc_per_node`` x ``--nnodes``), if it says
    (``--nnodes=1:4``, elastic, is no count; ``--nproc_per_node=gpu`` neither); for the
    DeepSpeed launcher, :func:`deepspeed_ranks`."""
    opts = torchrun_args(command)
    if opts is None:
        ds = deepspeed_args(command)
        return deepspeed_ranks(ds) if ds is not None else None
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
    ``--node_rank`` (``--node-rank``; the DeepSpeed launcher's with ``--no_ssh``), else the
    first of :data:`NODE_RANK_ENV` set. None when nothing says (torchrun's dynamic rendezvous
    assigns it only once every node has come)."""
    opts = torchrun_args(command) or deepspeed_args(command) or {}
    for raw in (opts.get("node_rank"), *(env.get(name) for name in NODE_RANK_ENV)):
        if raw is not None and raw.strip().isdigit():
            return int(raw)
    return None
