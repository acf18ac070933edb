"""The child job: started unchanged in its own process group, signals forwarded, nothing left.

* The child gets its own session, so a signal the auditor forwards reaches the whole group
  (torchrun, and through torchrun's own handlers, its ranks).
* The auditor makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): ranks that
  torchrun started in sessions of their own, and DataLoader workers, are re-parented to the
  auditor if their parent dies, so :func:`reap_descendants` can find and end them at exit.
* stdout and stderr are inherited (the job's output passes through byte for byte), or both go
  to ``output``: on a terminal, the live view's pty (:mod:`auditor.cluster.relay`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

import psutil

_PR_SET_CHILD_SUBREAPER = 36


# The shell's exit codes for a command that cannot run (POSIX): not found, found but not
# executable. A usage error (an empty command, a missing script argument) stays 2.
NOT_FOUND_EXIT = 127
NOT_EXECUTABLE_EXIT = 126


class LaunchError(RuntimeError):
    """The command cannot be started; the message is one clear line for the user, and
    ``exit_code`` what ``auditor run`` exits with (2, 126 or 127)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def check_command(command: Sequence[str]) -> None:
    """Refuse, before anything starts, a command that cannot run: empty, not found, or a
    ``.py`` script argument that does not exist."""
    if not command:
        raise LaunchError(
            "nothing to run: give the command after --, e.g. auditor run -- torchrun train.py"
        )
    _check_executable(command[0])
    for arg in command[1:]:
        if arg.startswith("-"):
            continue
        if arg.endswith(".py"):
            if not os.path.isfile(arg):
                raise LaunchError(f"script not found: {arg}")
            break


def _check_executable(exe: str) -> None:
    """Refuse ``exe`` as a shell would: 127 when there is no such file, 126 when there is one
    that cannot be executed (no execute permission, a directory)."""
    if shutil.which(exe) is not None:
        return
    if os.sep in exe:
        candidates = [exe]
    else:
        candidates = [os.path.join(d or ".", exe) for d in os.get_exec_path()]
    found = next((c for c in candidates if os.path.exists(c)), None)
    if found is None:
        raise LaunchError(f"command not found: {exe}", NOT_FOUND_EXIT)
    why = "is a directory" if os.path.isdir(found) else "permission denied (not executable)"
    raise LaunchError(f"cannot execute {found}: {why}", NOT_EXECUTABLE_EXIT)


def exit_code_of(returncode: int) -> int:
    """Shell convention: a child killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Child:
    """One launched command and its process group."""

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str], *, output: int | None = None
    ) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.output = output
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                start_new_session=True,
                stdout=self.output,
                stderr=self.output,
            )
        except OSError as exc:
            # Found and checked, yet the kernel refused it (no #! line, a foreign binary) or
            # it went away since: the shell's 126 or 127.
            code = NOT_FOUND_EXIT if exc.errno == errno.ENOENT else NOT_EXECUTABLE_EXIT
            raise LaunchError(
                f"cannot start {self.command[0]}: {exc.strerror or exc}", code
            ) from None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, then SIGKILL what is left after ``grace_s``."""
        if self.poll() is not None:
            return self.poll()
        self.signal_group(signal.SIGTERM)
        code = self.wait(grace_s)
        if code is None:
            self.signal_group(signal.SIGKILL)
            code = self.wait(5)
        return code


def descendants(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []


def reap_descendants(grace_s: float = 3.0, *, exclude: Sequence[int] = ()) -> list[int]:
    """End every process below this one (ranks, DataLoader workers, Ray's processes).

    Returns the PIDs that had to be signalled (empty when everything had already exited).
    """
    procs = [p for p in descendants() if p.pid not in set(exclude)]
    if not procs:
        return []
    end_processes(procs, grace_s)
    # Children re-parented to us while we waited (grandchildren of those we ended).
    late = [p for p in descendants() if p.pid not in set(exclude)]
    end_processes(late, 0)
    return [p.pid for p in procs + late]


def end_processes(procs: Sequence[psutil.Process], grace_s: float) -> None:
    """SIGTERM each, SIGKILL what is still there after ``grace_s``, and reap them."""
    for p in procs:
        try:
            p.terminate() if grace_s > 0 else p.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s or 2)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2)
