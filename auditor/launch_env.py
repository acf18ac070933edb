"""Where a job was launched from: the launcher, the scheduler, and the identity they hand out.

A run is started by a launcher (``torchrun``, ``srun``, ``deepspeed``, ``accelerate launch``,
plain ``python``), often inside a scheduler's allocation (a SLURM job, a Kubernetes pod of a
Kubeflow PyTorchJob or JobSet), and each of them says who the process is in its own words:
``RANK`` or ``SLURM_PROCID``, ``SLURMD_NODENAME`` or the pod's hostname, ``SLURM_JOB_ID`` or the
PyTorchJob's name. This module reads them once, from tables, so ``auditor run`` (the job's
name, the key its auditors meet under in the job view, each auditor's name there), the probe
(a rank's number before its process group exists) and ``auditor doctor`` agree.

Pure: a command line, an environment and (in a pod) its labels in, a :class:`Launch` out. The
one file read, the pod's labels from the Kubernetes downward API, is :func:`read_pod_labels`.

Tables (a new launcher is a row, not a branch):

* :data:`LAUNCHERS`: how a command names a launcher (program, ``python -m`` module, sub-command)
  and how the environment says the auditor itself runs inside one (variables that must all be
  set), first match wins.
* :data:`IDENTITY`: where each launcher's processes read rank, local rank, world size, node and
  node rank, first source whose condition holds wins, field by field.
* :data:`JOB_SOURCES`: where a scheduler names the job (an environment variable, a pod label, a
  pattern of the master's address).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from auditor.torchrun import NODE_RANK_ENV, torchrun_args

SLURM, KUBERNETES, NONE = "slurm", "kubernetes", "none"

# Python interpreters: ``python train.py`` is the plain launcher; ``python -m X`` is X's.
_PYTHONS = re.compile(r"^python(\d+(\.\d+)?)?$")
# Programs that run the rest of the command line (``env A=1 srun ...``, ``nice -n 5 ...``).
_WRAPPERS = frozenset({"env", "nice", "nohup", "time", "stdbuf", "numactl", "taskset"})


@dataclass(frozen=True)
class Launcher:
    """One launcher: how a command starts it, how its processes' environment shows it."""

    name: str
    # The scheduler it implies ("none": it runs anywhere).
    scheduler: str = NONE
    # Program basenames that are this launcher (``srun``), and ``python -m`` modules.
    programs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    # A sub-command it must be given (``accelerate launch``), where the program alone is not it.
    subcommand: str | None = None
    # Inside it: variables that are all set in its processes' environment, and ones that are not.
    env_all: tuple[str, ...] = ()
    env_none: tuple[str, ...] = ()
    # Where one auditor runs per task (or per pod) inside it, so several auditors of one job
    # meet in the job view (through Ray) to give one verdict.
    per_task: bool = False
    # Words for ``auditor doctor`` and the docs.
    about: str = ""

    def starts(self, program: str, rest: Sequence[str]) -> bool:
        """Whether a command whose program is ``program`` (followed by ``rest``) is this one."""
        if program in self.programs:
            return self.subcommand is None or (bool(rest) and rest[0] == self.subcommand)
        if _PYTHONS.match(program) and self.modules:
            return _python_module(rest) in self.modules
        return False

    def around(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` is the environment of a process this launcher started."""
        return (
            bool(self.env_all)
            and all(env.get(name) for name in self.env_all)
            and not any(env.get(name) for name in self.env_none)
        )


# First match wins, for the command and for the environment alike.
LAUNCHERS: tuple[Launcher, ...] = (
    Launcher(
        "srun",
        SLURM,
        programs=("srun",),
        env_all=("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID"),
        per_task=True,
        about="a task of a SLURM job step",
    ),
    Launcher(
        "accelerate",
        programs=("accelerate",),
        subcommand="launch",
        modules=("accelerate.commands.launch",),
        env_all=("ACCELERATE_MIXED_PRECISION", "LOCAL_RANK"),
        # Before torchrun: its multi-GPU launch runs torchrun, whose variables it sets too.
        about="accelerate launch",
    ),
    Launcher(
        "torchrun",
        programs=("torchrun",),
        modules=("torch.distributed.run", "torch.distributed.launch"),
        env_all=("TORCHELASTIC_RUN_ID",),
        about="a worker torchrun started",
    ),
    Launcher(
        "deepspeed",
        programs=("deepspeed",),
        modules=("deepspeed.launcher.runner", "deepspeed.launcher.launch"),
        # What deepspeed.launcher.launch hands each rank besides RANK, LOCAL_RANK, WORLD_SIZE:
        # its node's rank and the node count (CROSS_*), its node's ranks (LOCAL_SIZE).
        env_all=("CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE", "LOCAL_RANK"),
        about="the DeepSpeed launcher",
    ),
    Launcher(
        "sbatch",
        SLURM,
        programs=("sbatch",),
        env_all=("SLURM_JOB_ID",),
        about="a SLURM batch script (or salloc shell)",
    ),
    Launcher(
        "pod",
        KUBERNETES,
        env_all=("KUBERNETES_SERVICE_HOST", "RANK", "WORLD_SIZE", "MASTER_ADDR"),
        env_none=("LOCAL_RANK", "TORCHELASTIC_RUN_ID"),
        per_task=True,
        about="a pod of a training operator's job (PyTorchJob, JobSet): RANK and WORLD_SIZE "
        "set, no launcher",
    ),
    Launcher(
        "env",
        env_all=("RANK", "WORLD_SIZE", "MASTER_ADDR"),
        env_none=("LOCAL_RANK", "TORCHELASTIC_RUN_ID"),
        per_task=True,
        about="RANK and WORLD_SIZE set by whoever started it, no launcher",
    ),
)

# Launcher names for a command that is none of the above.
PYTHON = "python"  # ``python train.py`` (a single process, or one that calls mp.spawn)


@dataclass(frozen=True)
class Source:
    """Where one launcher's processes read their place in the job: a variable per field."""

    name: str
    when: tuple[str, ...]  # all set: this source applies
    rank: str | None = None
    local_rank: str | None = None
    world_size: tuple[str, ...] = ()
    node: str | None = None
    node_rank: tuple[str, ...] = ()


# First source that applies gives each field it names; later ones fill the rest.
IDENTITY: tuple[Source, ...] = (
    Source(
        "torch",
        when=("RANK",),
        rank="RANK",
        local_rank="LOCAL_RANK",
        world_size=("WORLD_SIZE",),
        node_rank=NODE_RANK_ENV,
    ),
    Source(
        "slurm",
        when=("SLURM_STEP_ID", "SLURM_PROCID"),
        rank="SLURM_PROCID",
        local_rank="SLURM_LOCALID",
        world_size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
        node="SLURMD_NODENAME",
        node_rank=("SLURM_NODEID",),
    ),
    # The batch script of a SLURM job (no step): its node, but no rank of its own.
    Source("slurm", when=("SLURM_JOB_ID",), node="SLURMD_NODENAME", node_rank=("SLURM_NODEID",)),
    # A node's rank where only the launcher's node-level variables say it (a pod that runs
    # torchrun with the operator's PET_NODE_RANK).
    Source("node", when=(), node_rank=NODE_RANK_ENV),
)


@dataclass(frozen=True)
class JobSource:
    """One place a scheduler names the job: a variable, a pod label, or a pattern of one."""

    scheduler: str
    env: str | None = None
    label: str | None = None
    # The name is this pattern's ``name`` group in ``env``'s value.
    pattern: str | None = None
    # Whether the value is the job's id (SLURM_JOB_ID), which then is its ``auditor_job``.
    is_id: bool = False
    # The variable that holds the job's name, next to an id.
    name_env: str | None = None


# The Kubernetes downward API file the example PyTorchJob mounts the pod's labels at.
POD_LABELS_FILE = "/etc/podinfo/labels"
POD_LABELS_ENV = "AUDITOR_POD_LABELS"

# First that gives a value wins.
JOB_SOURCES: tuple[JobSource, ...] = (
    JobSource(SLURM, env="SLURM_JOB_ID", is_id=True, name_env="SLURM_JOB_NAME"),
    # Kubeflow Trainer v2 and JobSet-based jobs (the JobSet's name; XPK and others set it).
    JobSource(KUBERNETES, env="JOBSET_NAME"),
    # The training operator's own pod labels (through the downward API).
    JobSource(KUBERNETES, label="training.kubeflow.org/job-name"),
    JobSource(KUBERNETES, label="jobset.sigs.k8s.io/jobset-name"),
    # Kubeflow's PyTorchJob: MASTER_ADDR is the master replica's service, ``<job>-master-0``.
    JobSource(KUBERNETES, env="MASTER_ADDR", pattern=r"^(?P<name>.+)-master-0$"),
    # Kubeflow Trainer v2 (TrainJob): PET_MASTER_ADDR is ``<job>-node-0-0.<job>``.
    JobSource(KUBERNETES, env="PET_MASTER_ADDR", pattern=r"^(?P<name>[^.]+)-node-0-0\."),
)


@dataclass(frozen=True)
class Launch:
    """What a run's command and environment say about where it runs and who it is."""

    # What the command starts (a LAUNCHERS name, "python", or the program's name).
    launcher: str
    # What the auditor itself runs inside (a LAUNCHERS name), or None.
    within: str | None
    scheduler: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    node: str | None = None
    node_rank: int | None = None
    # The scheduler's job: its id (SLURM_JOB_ID) and name (SLURM_JOB_NAME, the PyTorchJob's).
    job_id: str | None = None
    job_name: str | None = None
    # Where each field was read (``{"rank": "SLURM_PROCID", ...}``), for ``auditor doctor``.
    sources: dict[str, str] = field(default_factory=dict)
    # SLURM: the cluster and the step the auditor runs in (the step's tasks are one run).
    slurm_cluster: str | None = None
    slurm_step: str | None = None
    master: str | None = None  # MASTER_ADDR:MASTER_PORT, where set
    # How many nodes the scheduler's allocation spans (SLURM_JOB_NUM_NODES), where it says.
    job_nodes: int | None = None

    @property
    def per_task(self) -> bool:
        """Whether this auditor is one of several of one job (one per task, or per pod)."""
        spec = _launcher(self.within)
        return bool(spec and spec.per_task and (self.world_size or 1) > 1)

    @property
    def job_label(self) -> str | None:
        """The job's name in reports and the ``auditor_job`` label: SLURM's job id (what
        ``squeue``/``sacct`` name it by), else the operator's job name."""
        return self.job_id or self.job_name

    @property
    def key(self) -> str | None:
        """What every auditor of this job has in common in the job view (only where several
        run, one per task or pod); None otherwise."""
        if not self.per_task:
            return None
        if self.within == "srun":
            return f"slurm:{self.slurm_cluster or ''}/{self.job_id}.{self.slurm_step}"
        return f"pod:{self.job_name or ''}@{self.master or ''}"

    @property
    def member(self) -> str | None:
        """This auditor's name among the job's auditors on one node (two tasks of a step, or
        two pods, on one machine): ``task<SLURM_PROCID>``, ``rank<RANK>``."""
        if not self.per_task or self.rank is None:
            return None
        return f"task{self.rank}" if self.within == "srun" else f"rank{self.rank}"


def remote_ranks_note(launch: Launch) -> str | None:
    """Where ``auditor run -- srun`` starts tasks on other nodes than its own: their ranks
    report to their own node, out of this run's reach. None where that is not so."""
    if launch.launcher != "srun" or (launch.job_nodes or 1) <= 1:
        return None
    return (
        f"srun may start tasks on all {launch.job_nodes} nodes of the allocation; ranks on "
        "other nodes than this one are not heard here: for several nodes run 'srun auditor run "
        "--address <Ray head> -- python ...' (one auditor per task)"
    )


def identify(
    command: Sequence[str], env: Mapping[str, str], labels: Mapping[str, str] | None = None
) -> Launch:
    """Where ``command`` (``auditor run``'s, or empty) runs with ``env``; ``labels``: the pod's
    labels (:func:`read_pod_labels`), where known."""
    within = next((spec for spec in LAUNCHERS if spec.around(env)), None)
    launcher = command_launcher(command)
    spec = _launcher(launcher)
    scheduler = (
        within.scheduler
        if within is not None and within.scheduler != NONE
        else spec.scheduler
        if spec is not None and spec.scheduler != NONE
        else KUBERNETES
        if env.get("KUBERNETES_SERVICE_HOST")
        else NONE
    )
    sources: dict[str, str] = {}
    values: dict[str, object] = {}
    for src in IDENTITY:
        if not all(env.get(name) for name in src.when):
            continue
        for name, var in (("rank", src.rank), ("local_rank", src.local_rank)):
            if var and name not in values and _int(env.get(var)) is not None:
                values[name], sources[name] = _int(env.get(var)), var
        for name, vars_ in (("world_size", src.world_size), ("node_rank", src.node_rank)):
            for var in vars_:
                if name not in values and _int(env.get(var)) is not None:
                    values[name], sources[name] = _int(env.get(var)), var
        if src.node and "node" not in values and env.get(src.node):
            values["node"], sources["node"] = env[src.node], src.node
    job_id, job_name, job_from = _job(env, labels or {}, scheduler)
    if job_from:
        sources["job"] = job_from
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    return Launch(
        launcher=launcher,
        within=within.name if within else None,
        scheduler=scheduler,
        rank=_opt_int(values.get("rank")),
        local_rank=_opt_int(values.get("local_rank")),
        world_size=_opt_int(values.get("world_size")),
        node=str(values["node"]) if "node" in values else None,
        node_rank=_opt_int(values.get("node_rank")),
        job_id=job_id,
        job_name=job_name,
        sources=sources,
        slurm_cluster=env.get("SLURM_CLUSTER_NAME") or None,
        slurm_step=env.get("SLURM_STEP_ID") or None,
        master=f"{addr}:{port or ''}" if addr else None,
        job_nodes=_int(env.get("SLURM_JOB_NUM_NODES")),
    )


def command_launcher(command: Sequence[str]) -> str:
    """The launcher ``command`` starts: a :data:`LAUNCHERS` name, ``python`` for a script, else
    the program's own name ("" for no command)."""
    cmd = list(command)
    while cmd and os.path.basename(cmd[0]) in _WRAPPERS:
        cmd = _unwrap(cmd)
    if not cmd:
        return ""
    program, rest = os.path.basename(cmd[0]), cmd[1:]
    for spec in LAUNCHERS:
        if spec.starts(program, rest):
            return spec.name
    if _PYTHONS.match(program):
        return PYTHON
    if torchrun_args(cmd) is not None:
        return "torchrun"
    return program


def rank_from_env(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(rank, world size) as the launcher's environment gives them, before any process group
    exists: ``RANK``/``WORLD_SIZE``, else a SLURM task's ``SLURM_PROCID``/``SLURM_NTASKS``."""
    launch = identify((), env)
    return launch.rank, launch.world_size


def read_pod_labels(env: Mapping[str, str]) -> dict[str, str]:
    """The pod's labels from the Kubernetes downward API file (``AUDITOR_POD_LABELS``, else
    :data:`POD_LABELS_FILE`): ``key="value"`` lines. Empty where there is none."""
    path = env.get(POD_LABELS_ENV) or POD_LABELS_FILE
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError:
        return {}
    return parse_labels(text)


def parse_labels(text: str) -> dict[str, str]:
    """The downward API's ``key="value"`` lines (values quoted, with Go's escapes)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.strip().partition("=")
        if not eq or not key:
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key] = value
    return out


def _job(
    env: Mapping[str, str], labels: Mapping[str, str], scheduler: str
) -> tuple[str | None, str | None, str]:
    """(job id, job name, where read) from the first :data:`JOB_SOURCES` row that gives one."""
    for src in JOB_SOURCES:
        if src.pattern and src.scheduler != scheduler:
            continue  # a pattern of an address is only that scheduler's naming inside it
        if src.label:
            raw, where = labels.get(src.label), f"pod label {src.label}"
        else:
            raw, where = (env.get(src.env) if src.env else None), str(src.env)
        if not raw:
            continue
        if src.pattern:
            m = re.match(src.pattern, raw)
            if not m:
                continue
            raw = m.group("name")
        if src.is_id:
            name = env.get(src.name_env) if src.name_env else None
            return raw, name or None, where
        return None, raw, where
    return None, None, ""


def _launcher(name: str | None) -> Launcher | None:
    return next((spec for spec in LAUNCHERS if spec.name == name), None)


def _python_module(rest: Sequence[str]) -> str | None:
    """The module of ``python [opts] -m module``, or None."""
    for i, arg in enumerate(rest):
        if arg == "-m":
            return rest[i + 1] if i + 1 < len(rest) else None
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if not arg.startswith("-"):
            return None
    return None


def _unwrap(cmd: list[str]) -> list[str]:
    """The command a wrapper (``env A=1``, ``nice -n 5``) runs."""
    rest = cmd[1:]
    i = 0
    while i < len(rest) and (rest[i].startswith("-") or "=" in rest[i]):
        # ``nice -n 5``: an option's value; ``env A=1``: an assignment.
        i += 2 if rest[i] in ("-n", "-u", "-C", "-i", "-o", "-e") else 1
    return rest[i:]


def _int(raw: str | None) -> int | None:
    raw = (raw or "").strip()
    return int(raw) if raw.isdigit() else None


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) else None
