"""Helpers for the probe tests: run a script in a fresh Python process with the probe booted the
way ``auditor run`` boots it (``PYTHONPATH`` = the boot folder, ``AUDITOR_PROBE=1``,
``AUDITOR_SINK`` = a socket served by a real :class:`~auditor.cluster.intake.RankIntake`).

The probe patches torch once per process, so every test that needs the real hooks runs its
training loop in a subprocess; the intake (the node side) runs here, in the test process.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from auditor.cluster.intake import RankIntake
from auditor.probe.sink import encode
from auditor.samples import Batch, FlopCount, MemoryBudget, RankInfo, StepSample
from tests.helpers.waiting import wait_for, wait_quietly

REPO = Path(__file__).resolve().parents[2]
BOOT = REPO / "auditor" / "probe" / "boot"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = SCRIPTS / "train.py"


def short_dir() -> str:
    """A short directory under /tmp: Unix socket paths must stay under ~107 bytes."""
    return tempfile.mkdtemp(prefix="aud", dir="/tmp")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_RANK_VARS = ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def clean_env() -> dict[str, str]:
    """The test process's environment without anything that would boot a probe or set a rank."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AUDITOR_") and k not in _RANK_VARS
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    # The scripts train on CPU; on a CUDA host the probe would time them with CUDA events, which
    # see none of the CPU work. These tests are about the CPU path: hide any GPU.
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def probe_env(sink: str, *, boot: bool = True) -> dict[str, str]:
    env = clean_env()
    if boot:
        env["PYTHONPATH"] = str(BOOT)
        env["AUDITOR_PROBE"] = "1"
    env["AUDITOR_SINK"] = sink
    env["AUDITOR_PROBE_FLUSH_S"] = "0.1"
    return env


@dataclass
class JobResult:
    """What one subprocess printed and what its rank delivered to the intake."""

    returncode: int
    stdout: str
    stderr: str
    pid: int
    infos: dict[int, RankInfo] = field(default_factory=dict)
    steps: list[StepSample] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)
    memory: list[MemoryBudget] = field(default_factory=list)
    flops: list[FlopCount] = field(default_factory=list)
    workers: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    connections: int = 0
    bad_lines: int = 0

    def printed(self, key: str) -> str:
        """The value of the last ``KEY=value`` line the script printed."""
        values = [
            ln.split("=", 1)[1] for ln in self.stdout.splitlines() if ln.startswith(key + "=")
        ]
        assert values, f"{key}= not printed; stdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return values[-1]


class Job:
    """A script started in its own process, with an intake listening for its rank (or not)."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        with_intake: bool = True,
        probe: bool = True,
        boot: bool = True,
    ) -> None:
        self.dir = short_dir()
        self.sink = os.path.join(self.dir, "s.sock")
        self.workers: list[tuple[int, int, tuple[int, ...]]] = []
        self.intake: RankIntake | None = None
        if with_intake:
            self.intake = RankIntake(
                self.sink, on_workers=lambda r, p, w: self.workers.append((r, p, w))
            )
            self.intake.start()
        full_env = probe_env(self.sink, boot=boot) if probe else clean_env()
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            env=full_env,
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(
        self, timeout: float = 120.0, *, wait_rank_s: float = 10.0, ranks: int = 1
    ) -> JobResult:
        """Wait for the process, then until the intake saw ``ranks`` ranks end (``wait_rank_s``
        at most: pass a short wait where no rank is expected to connect)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        res = JobResult(self.proc.returncode, out, err, self.proc.pid)
        if self.intake is not None:
            intake = self.intake

            def all_ended() -> bool:
                batch = intake.drain()
                res.infos.update({i.rank: i for i in batch.infos})
                res.steps.extend(batch.steps)
                res.ended.update(batch.ended)
                res.memory.extend(batch.memory)
                res.flops.extend(batch.flops)
                return len(res.ended) >= ranks

            # The rank's socket closes when its process ends; wait until the intake saw that (or
            # not: where no rank connects, the test's own asserts judge what came).
            wait_quietly(all_ended, wait_rank_s, every=0.05)
            res.connections = self.intake.connections
            res.bad_lines = self.intake.bad_lines
            self.intake.stop()
        res.workers = list(self.workers)
        res.steps.sort(key=lambda s: (s.rank, s.step))
        shutil.rmtree(self.dir, ignore_errors=True)
        return res


def run_job(argv: list[str], **kwargs: object) -> JobResult:
    return Job(argv, **kwargs).result()  # type: ignore[arg-type]


def loop_tail(depth: int) -> str:
    """The training loop's end in the tests' own scripts (``run_script``), inside ``depth``
    loops: a real step, then a line that says the script got through."""
    pad = "    " * depth
    step = ("loss = nn.functional.mse_loss(model(x), y)", "loss.backward()", "opt.step()")
    return "".join(f"\n{pad}{line}" for line in (*step, "opt.zero_grad()")) + (
        '\nprint("DONE=1", flush=True)\n'
    )


def run_script(text: str, argvs: dict[str, list[str]]) -> dict[str, JobResult]:
    """The script ``text`` run once per entry of ``argvs`` (its arguments, by run name), one
    after the other under the probe; each must end well and print ``DONE=1``."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="aud") as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(text)
        for name, args in argvs.items():
            res = Job([str(script), *args]).result(timeout=240, wait_rank_s=20)
            assert res.returncode == 0 and "DONE=1" in res.stdout, res.stderr[-3000:]
            out[name] = res
    return out


def send(path: str, *msgs: dict[str, object]) -> None:
    """``msgs`` sent over one connection to the sink socket at ``path``, as a probe sends them."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b"".join(encode(m) for m in msgs))


def hello(rank: int, job: str = "j") -> dict[str, object]:
    """A rank's ``hello`` message (world of 2, host ``h``)."""
    info = RankInfo(rank=rank, world_size=2, pid=1000 + rank, host="h", job=job)
    return {"type": "hello", "version": 1, "info": info.to_dict()}


def collect(intake: RankIntake, ended: int) -> Batch:
    """What ``intake`` received until ``ended`` ranks said goodbye (or hung up): steps,
    memory budgets and FLOP counts."""
    steps: list[StepSample] = []
    memory: list[MemoryBudget] = []
    flops: list[FlopCount] = []
    done: set[int] = set()

    def poll() -> bool:
        b = intake.drain()
        steps.extend(b.steps)
        memory.extend(b.memory)
        flops.extend(b.flops)
        done.update(b.ended)
        return len(done) >= ended

    wait_for(poll, timeout=10)
    return Batch(steps=tuple(steps), memory=tuple(memory), flops=tuple(flops))
