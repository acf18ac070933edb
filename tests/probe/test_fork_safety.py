"""The probe must not make a job that forks hang. DDP's gradient all-reduce is timed through a
communication hook whose future callback runs on gloo's (or NCCL's) own thread; each such
callback used to create a Python thread state there and delete it after, taking the
interpreter's thread-list lock without the GIL, and a DataLoader forking its workers at that
moment left the child blocked for ever in ``PyOS_AfterFork_Child`` (python/cpython#112275,
Python before 3.12): a Lightning job validating on a loader with workers hung about one run in
five. The job here (two ranks, torchrun, gloo) forks after every backward and counts the thread
states its loop created.
"""

from __future__ import annotations

import re

from . import SCRIPTS, Job

STEPS = 30


def test_comm_hook_callbacks_keep_their_thread_state() -> None:
    argv = [
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(SCRIPTS / "fork_after_step.py"), "--steps", str(STEPS),
    ]  # fmt: skip
    res = Job(argv, env={"AUDITOR_EXIT_WAIT_S": "10"}).result(timeout=240, wait_rank_s=20, ranks=2)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    # The probe's hook timed every step's all-reduce on both ranks: its callbacks ran.
    for rank in (0, 1):
        steps = [s for s in res.steps if s.rank == rank]
        assert len(steps) == STEPS, (rank, len(steps))
        assert all(s.collective_wait_s is not None for s in steps), steps
        # The sink's thread and the backend's few threads: each keeps one state (without that,
        # 30 steps of small buckets created 590).
        assert int(_printed(res.stdout, f"RANK{rank}_THREAD_STATES")) <= 10, res.stdout
        assert _printed(res.stdout, f"RANK{rank}_FORKS_HUNG") == "0", res.stdout


def _printed(stdout: str, key: str) -> str:
    """The value of ``KEY=value`` anywhere in the output: two ranks share torchrun's stdout, so
    one rank's line can land in the middle of the other's."""
    found = re.findall(rf"{key}=(\d+)", stdout)
    assert found, f"{key}= not printed:\n{stdout}"
    return str(found[-1])
