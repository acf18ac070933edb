"""A node's link to the job view, against the real actor on the session's local Ray: the other
node's batches arrive through pulls that never wait on Ray, the last node out removes the view,
and a view that is gone is an error rather than a hang."""

from __future__ import annotations

import pytest

from auditor.cluster.jobview import RUNNING, JobViewClient
from auditor.samples import Batch, StepSample
from tests.helpers.waiting import wait_for

ray = pytest.importorskip("ray")


def steps_of(batches: list[Batch]) -> list[tuple[int, int]]:
    return [(s.rank, s.step) for b in batches for s in b.steps]


def collect(client: JobViewClient, want: int) -> list[Batch]:
    got: list[Batch] = []

    def enough() -> bool:
        got.extend(client.pull())
        return len(steps_of(got)) >= want

    wait_for(enough, timeout=60, every=0.1)
    return got


def test_each_node_reads_the_others_batches_and_the_last_removes_the_view(
    ray_address: str,
) -> None:
    a = JobViewClient("job:client-test", "node-a")
    b = JobViewClient("job:client-test", "node-b")
    for n in range(3):
        a.push(Batch(steps=(StepSample(rank=0, step=n, time=1.0 + n, step_s=0.1),)))
    b.push(Batch(steps=(StepSample(rank=1, step=0, time=1.0, step_s=0.1),)))
    assert steps_of(collect(b, 3)) == [(0, 0), (0, 1), (0, 2)]  # its own never comes back
    assert steps_of(collect(a, 1)) == [(1, 0)]
    assert {n["node"]: n["state"] for n in a.nodes} == {"node-a": RUNNING, "node-b": RUNNING}

    b.push(Batch(steps=(StepSample(rank=1, step=1, time=2.0, step_s=0.1),)))
    # a's job ended: it waits for b's last samples (b is still running, so up to wait_s).
    last = a.finish(exit_code=0, wait_s=0.5)
    assert (1, 1) in steps_of(last)
    # b had read all of a's steps; a's state is done, so b does not wait out wait_s.
    assert steps_of(b.finish(exit_code=0, wait_s=5.0)) == []
    # The last node released the view: its actor is gone from the namespace.
    wait_for(lambda: not named_actor_alive(a.name), timeout=30)


def named_actor_alive(name: str) -> bool:
    try:
        ray.get_actor(name, namespace="auditor")
    except ValueError:
        return False
    return True


def test_a_view_that_is_gone_is_an_error_not_a_hang(ray_address: str) -> None:
    c = JobViewClient("job:client-gone", "node-a")
    assert c.pull() == []  # the join's answer, or nothing yet: never an error
    wait_for(lambda: named_actor_alive(c.name), timeout=30)
    ray.kill(ray.get_actor(c.name, namespace="auditor"), no_restart=True)

    def failed() -> bool:
        try:
            c.pull()
        except ray.exceptions.RayActorError:
            return True
        return False

    wait_for(failed, timeout=30, every=0.1)
