"""The job view (one job across nodes) and the audit pipeline, without Ray: grouping keys, clock
offsets, node states and the same report whatever the batch source."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from auditor.audit import Audit
from auditor.cluster.jobview import (
    LOST,
    RUNNING,
    JobViewCore,
    actor_name,
    job_key,
    label_batch,
    member_name,
)
from auditor.samples import Batch, DeviceSample, NodeCpu, RankInfo, StepSample
from auditor.telemetry.recorded import read_recording, write_recording
from auditor.torchrun import node_rank
from tests.helpers.clocks import Clock
from tests.helpers.jobs import JobBuilder, RankSpec, balanced, with_rank


def torchrun(node_rank: int, port: int, *extra: str) -> list[str]:
    return [
        "torchrun",
        "--nnodes=2",
        "--nproc_per_node",
        "1",
        f"--node_rank={node_rank}",
        "--master_addr=10.0.0.1",
        f"--master_port={port}",
        *extra,
        "train.py",
        "--nnodes=7",  # the script's own argument: not torchrun's
    ]


def test_job_key_joins_the_nodes_of_one_job_and_no_other() -> None:
    a0, a1 = job_key(None, torchrun(0, 29500), {}), job_key(None, torchrun(1, 29500), {})
    assert a0 == a1 == "rdzv:10.0.0.1:29500/none"
    assert job_key(None, torchrun(0, 29501), {}) != a0  # another job's rendezvous
    assert job_key(None, torchrun(0, 29500, "--rdzv_id=7"), {}) != a0  # another run id
    dyn = ["python", "-m", "torch.distributed.run", "--nnodes", "1:4", "--rdzv-endpoint", "h:1"]
    assert job_key(None, [*dyn, "x.py"], {}) == "rdzv:h:1/none"
    assert job_key(None, ["torchrun", "--nproc_per_node=2", "x.py"], {}) is None  # one node
    assert job_key(None, ["torchrun", "x.py"], {"PET_NNODES": "2"}) == "rdzv:127.0.0.1:29500/none"
    assert job_key("mine", ["python", "x.py"], {}) == "job:mine"
    assert actor_name(a0 or "") != actor_name("job:mine")


def test_runs_of_one_job_on_one_host_are_told_apart_by_torchruns_node_rank() -> None:
    assert node_rank(torchrun(1, 29500), {"GROUP_RANK": "5"}) == 1  # the command line first
    assert node_rank(["torchrun", "--node-rank", "3", "x.py"], {}) == 3
    assert node_rank(["torchrun", "x.py"], {"PET_NODE_RANK": "2", "SLURM_NODEID": "4"}) == 2
    assert node_rank(["python", "x.py"], {"GROUP_RANK": "1"}) == 1
    assert node_rank(["torchrun", "x.py", "--node_rank=1"], {}) is None  # the script's own
    assert member_name("gpu-a", 1) == "gpu-a/node1" and member_name("gpu-a", None) == "gpu-a"


def test_a_runs_ranks_host_and_gpu_samples_carry_one_node_name() -> None:
    """The rules match a GPU's PIDs and a host's memory to ranks by node name: a run named
    ``vm/node1`` in the job relabels all three, not its ranks alone."""
    batch = Batch(
        infos=(RankInfo(rank=1, world_size=2, host="vm", pid=7),),
        nodes=(NodeCpu(host="vm", time=0.0, cores=4, busy_cores=1, load1=1.0),),
        devices=(DeviceSample(node="vm", index=0, uuid="GPU-0", time=0.0),),
    )
    labelled = label_batch(batch, "vm/node1")
    assert {labelled.infos[0].host, labelled.nodes[0].host, labelled.devices[0].node} == {
        "vm/node1"
    }
    assert label_batch(labelled, "vm/node1") == labelled


def test_a_second_run_claiming_a_running_node_is_refused() -> None:
    clock = Clock(0.0)
    view = JobViewCore("k", clock=clock)
    assert "refused" not in view.join("host", run_id="a")
    assert "refused" not in view.join("host", run_id="a")  # the holder itself, again
    refused = view.join("host", run_id="b")
    assert "AUDITOR_NODE" in refused["refused"] and "--node_rank" in refused["refused"]
    # Its pushes, sent before it read the refusal, are not taken for the holder's.
    view.push("host", Batch(steps=(step(7, 0, 0.0),)), sent_at=0.0, run_id="b")
    view.push("host", Batch(steps=(step(0, 0, 0.0),)), sent_at=0.0, run_id="a")
    assert view.nodes["host"].ranks == {0}
    clock.at(60.0)  # the holder went silent: lost, and its name free again
    assert "refused" not in view.join("host", run_id="b")


def step(rank: int, n: int, t: float) -> StepSample:
    return StepSample(rank=rank, step=n, time=t, step_s=0.1)


def test_view_hands_each_node_the_others_samples_in_its_own_clock() -> None:
    clock = Clock(5_000.0)
    view = JobViewCore("k", clock=clock, lost_after_s=10)
    # node-1's clock runs 100 s ahead of node-0's; the view's is 5000 s ahead of node-0's.
    view.join("node-0", now=0.0)
    view.join("node-1", now=100.0)
    view.push("node-1", Batch(steps=(step(1, 0, 99.5),)), sent_at=100.0)
    view.push("node-0", Batch(steps=(step(0, 0, -0.5),)), sent_at=0.0)
    cursor, got, nodes = view.pull("node-0", 0, now=0.0)
    assert [s.rank for b in got for s in b.steps] == [1]  # its own batches are not sent back
    assert got[0].steps[0].time == -0.5  # half a second ago, in node-0's clock
    _, got1, _ = view.pull("node-1", 0, now=100.0)
    assert got1[0].steps[0].time == 99.5
    assert view.pull("node-0", cursor, now=0.0)[1] == []  # nothing new
    assert {n["node"]: n["ranks"] for n in nodes} == {"node-0": [0], "node-1": [1]}


def test_silent_node_is_lost_and_its_samples_stay() -> None:
    clock = Clock(0.0)
    view = JobViewCore("k", clock=clock, lost_after_s=10, keep_s=60)
    view.push("node-1", Batch(steps=(step(1, 3, 0.0),)), sent_at=0.0)
    clock.t = 5.0
    view.push("node-0", Batch(), sent_at=5.0)
    assert {s["node"]: s["state"] for s in view.states()} == {"node-0": RUNNING, "node-1": RUNNING}
    clock.t = 12.0
    _, got, nodes = view.pull("node-0", 0, now=12.0)
    states = {s["node"]: s for s in nodes}
    assert states["node-1"]["state"] == LOST and states["node-1"]["last_step"] == {"1": 3}
    assert [s.rank for b in got for s in b.steps] == [1]
    assert view.release("node-0") == 0  # node-1 lost, node-0 gone: the view may go


def test_view_holds_the_window_not_the_run() -> None:
    clock = Clock(0.0)
    view = JobViewCore("k", clock=clock, keep_s=30)
    for i in range(600):
        clock.t = float(i)
        view.push("node-1", Batch(steps=(step(1, i, float(i)),)), sent_at=float(i))
    assert view.window_batches() <= 31


def job_batches(specs: list[RankSpec], steps: int) -> list[Batch]:
    b = JobBuilder(specs)
    return [b._one_step() for _ in range(steps)]  # one delivery per step, as a node sends them


def part(b: Batch, rank: int) -> Batch:
    """What node ``rank`` (one rank per node) sends of ``b``."""
    host = f"node-{rank}"
    return Batch(
        infos=tuple(i for i in b.infos if i.rank == rank),
        steps=tuple(s for s in b.steps if s.rank == rank),
        processes=tuple(c for c in b.processes if c.rank == rank),
        nodes=tuple(n for n in b.nodes if n.host == host),
    )


def shift(b: Batch, delta: float) -> Batch:
    def move(xs: tuple) -> tuple:  # type: ignore[type-arg]
        return tuple(dataclasses.replace(x, time=x.time + delta) for x in xs)

    return dataclasses.replace(
        b, steps=move(b.steps), processes=move(b.processes), nodes=move(b.nodes)
    )


def test_pipeline_report_is_the_same_from_the_view_and_from_a_recording(tmp_path: Path) -> None:
    specs = with_rank(balanced(2), 1, data_wait=0.060, num_workers=1)
    specs = [dataclasses.replace(s, host=f"node-{r}") for r, s in enumerate(specs)]
    batches = job_batches(specs, 40)
    # Live: each rank on its own node; node-0's driver takes its own batches and node-1's
    # through the view (node-1's clock 7 s ahead).
    view = JobViewCore("k", clock=lambda: 0.0)
    live = Audit("job", window_s=None)
    for b in batches:
        node1 = shift(part(b, 1), 7.0)
        view.push("node-1", node1, sent_at=7.0)
        live.add(part(b, 0))
    live.add_all(view.pull("node-0", 0, now=0.0)[1])
    # Recorded: the same samples, written and read back.
    path = tmp_path / "job.ndjson"
    write_recording(path, batches, job="job")
    replayed = Audit("job", window_s=None)
    replayed.add(read_recording(path).batch)

    def doc(a: Audit) -> dict[str, object]:
        report = a.report(command=["x"], exit_code=0, duration_s=1.0).to_dict()
        report.pop("generated_at")
        return report

    live_doc, replay_doc = doc(live), doc(replayed)
    assert [f["kind"] for f in live_doc["findings"]] == ["data_starvation"]  # type: ignore[index]
    assert live_doc == replay_doc


def test_dead_rank_is_named_with_its_last_step() -> None:
    audit = Audit("job", window_s=None)
    audit.add(Batch(steps=(step(0, 4, 1.0), step(1, 4, 1.0))))
    audit.add(Batch(ended=(1,), died=(1,)))
    audit.add(Batch(ended=(0,), died=(0,)))  # torn down after rank 1: not the cause
    report = audit.report(command=["x"], exit_code=1, duration_s=1.0).to_dict()
    dead = report["job"]["dead_ranks"]
    assert [(d["rank"], d["last_step"], d["first"]) for d in dead] == [(1, 4, True), (0, 4, False)]
    assert any("rank 1 died after step 4" in n for n in report["notes"])


def test_a_new_run_of_the_job_starts_a_fresh_view() -> None:
    clock = Clock(0.0)
    view = JobViewCore("job:train", clock=clock, lost_after_s=10)
    view.push("node-1", Batch(steps=(step(1, 9, 0.0),)), sent_at=0.0)
    clock.t = 100.0  # that run's driver died; a new run of the same --job joins
    view.join("node-0", now=100.0)
    _, got, nodes = view.pull("node-0", 0, now=100.0)
    assert got == [] and [n["node"] for n in nodes] == ["node-0"]
