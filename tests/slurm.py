"""A real SLURM for tests (Debian's slurm-wlm and munge), on 127.0.0.1, in a temp dir.

One ``munged`` with its own key and socket, one ``slurmctld`` and one ``slurmd`` per node (two
by default: ``n1`` and ``n2``, both on this machine, each on its own port; Debian's build runs
several ``slurmd`` on one host with ``slurmd -N <name>``), all in the foreground under this
process, on free ports, stopped and waited for by :meth:`SlurmCluster.stop`. Nodes declare more
CPUs than a small machine has (``SlurmdParameters=config_overrides``), so a two-core host still
runs a two-task step on one node. Clients (``srun``, ``sbatch``, ``squeue``) find it through
``SLURM_CONF`` in :attr:`SlurmCluster.env`. Readiness is polled (``sinfo``), never slept for.

Where slurm-wlm or munge is not installed the test is skipped with how to install it (failed
under CI, :func:`tests.helpers.tools.require_tool`).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_for

INSTALL = "tests/run.sh installs it: apt-get install slurm-wlm munge"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_slurm() -> None:
    """Skip (or fail under CI) where SLURM's daemons or clients are missing."""
    for tool in ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo"):
        require_tool(tool, install=INSTALL)


class SlurmCluster:
    """``slurmctld`` + ``slurmd`` per node + ``munged``, all on 127.0.0.1."""

    def __init__(self, nodes: tuple[str, ...] = ("n1", "n2"), cpus: int = 4) -> None:
        require_slurm()
        self.nodes = nodes
        # Short: munge's and slurm's Unix sockets live under it.
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        self.conf = self.dir / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.host = socket.gethostname()
        self.user = getpass.getuser()
        self.cpus = cpus
        self.env = dict(os.environ)
        self.env["SLURM_CONF"] = str(self.conf)

    def start(self) -> SlurmCluster:
        munge = self.dir / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.munge_socket = munge / "munge.socket"
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir()
        ports = [free_port() for _ in range(1 + len(self.nodes))]
        self.conf.write_text(self._config(ports[0], ports[1:]))
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'seed'}",
        )
        wait_for(self.munge_socket.exists, 10, what="munged's socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        for node in self.nodes:
            self._spawn("slurmd", "-D", "-N", node, "-f", str(self.conf))
        wait_for(self._all_idle, 60, what="every slurmd idle in sinfo", every=0.3)
        return self

    def _config(self, ctld_port: int, node_ports: list[int]) -> str:
        d = self.dir
        lines = [
            "ClusterName=auditortest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={node_ports[0]}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"SlurmUser={self.user}",
            f"SlurmdUser={self.user}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            # A task that ends early (a killed rank) ends its step at once, as most sites set.
            "KillWait=5",
        ]
        for node, port in zip(self.nodes, node_ports, strict=True):
            lines.append(
                f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus} State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, *argv: str) -> None:
        log = open(self.dir / "log" / f"{argv[0]}-{len(self.procs)}.out", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                list(argv), env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )
        finally:
            log.close()
        self.procs.append(proc)

    def _all_idle(self) -> bool:
        dead = [p.args for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"SLURM daemon(s) exited: {dead}\n{self.logs()}")
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T")
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def run(self, *argv: str, timeout: float = 30) -> str:
        """A SLURM client command's output ("" when it failed)."""
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        return proc.stdout if proc.returncode == 0 else ""

    def jobs(self) -> list[str]:
        """The ids of the jobs SLURM still holds (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def logs(self) -> str:
        parts = []
        for path in sorted((self.dir / "log").glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-2000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        # The nodes first (they end their jobs' steps), then the controller, then munge.
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
