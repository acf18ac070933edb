"""auditor.launch_env: launcher, scheduler, rank, node and job from a command and an environment.

The SLURM environments are the variables a real ``slurmd`` (Debian's slurm-wlm 22.05) handed a
batch script and a task of ``srun -n2`` (trimmed to the ones that matter here); the Kubernetes
ones are what Kubeflow's training operator sets in a PyTorchJob's pods.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.launch_env import (
    KUBERNETES,
    LAUNCHERS,
    NONE,
    SLURM,
    command_launcher,
    identify,
    parse_labels,
    rank_from_env,
    read_pod_labels,
)

BATCH = {
    "SLURMD_NODENAME": "n1",
    "SLURM_CLUSTER_NAME": "auditortest",
    "SLURM_JOB_ID": "3",
    "SLURM_JOB_NAME": "b.sh",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
}
TASK1 = {
    **BATCH,
    "SLURM_LOCALID": "1",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
}
POD1 = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "MASTER_ADDR": "mnist-ddp-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "mnist-ddp-master-0",
    "PET_MASTER_PORT": "23456",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "PYTHONUNBUFFERED": "1",
}


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["srun", "-n2", "python", "train.py"], "srun"),
        (["/usr/bin/srun", "python", "train.py"], "srun"),
        (["torchrun", "--nproc_per_node=2", "train.py"], "torchrun"),
        (["python3", "-m", "torch.distributed.run", "train.py"], "torchrun"),
        (["deepspeed", "--num_gpus=2", "train.py"], "deepspeed"),
        (["accelerate", "launch", "train.py"], "accelerate"),
        (["python", "train.py"], "python"),
        (["python3.11", "-u", "train.py"], "python"),
        (["env", "A=1", "nice", "-n", "5", "srun", "python", "t.py"], "srun"),
        (["bash", "run.sh"], "bash"),
        ([], ""),
    ],
)
def test_command_launcher(command: list[str], name: str) -> None:
    assert command_launcher(command) == name


def test_a_launcher_sub_command_is_needed_where_declared() -> None:
    (accelerate,) = [s for s in LAUNCHERS if s.name == "accelerate"]
    assert accelerate.starts("accelerate", ["launch", "t.py"])
    assert not accelerate.starts("accelerate", ["config"])


def test_srun_task_gives_rank_node_and_the_job_id() -> None:
    launch = identify(["python", "train.py"], TASK1)
    assert (launch.launcher, launch.within, launch.scheduler) == ("python", "srun", SLURM)
    assert (launch.rank, launch.local_rank, launch.world_size) == (1, 1, 2)
    assert (launch.node, launch.node_rank) == ("n1", 0)
    assert (launch.job_id, launch.job_name, launch.job_label) == ("3", "b.sh", "3")
    assert launch.sources["rank"] == "SLURM_PROCID"
    assert launch.sources["world_size"] == "SLURM_STEP_NUM_TASKS"
    assert launch.sources["node"] == "SLURMD_NODENAME"
    assert launch.sources["job"] == "SLURM_JOB_ID"
    # One auditor per task: the step's tasks meet under one key, each under its task.
    assert launch.per_task
    assert launch.key == "slurm:auditortest/3.0"
    assert launch.member == "task1"


def test_batch_script_is_one_run_of_the_slurm_job() -> None:
    launch = identify(["srun", "python", "train.py"], BATCH)
    assert (launch.launcher, launch.within, launch.scheduler) == ("srun", "sbatch", SLURM)
    # The batch script is no rank: SLURM_PROCID=0 there is the batch step's, not a rank's.
    assert launch.rank is None and launch.world_size is None
    assert launch.node == "n1" and launch.job_label == "3"
    assert not launch.per_task and launch.key is None and launch.member is None


def test_srun_from_outside_an_allocation_is_slurm_without_a_job_yet() -> None:
    launch = identify(["srun", "-n2", "python", "train.py"], {"HOME": "/root"})
    assert (launch.launcher, launch.within, launch.scheduler) == ("srun", None, SLURM)
    assert launch.job_label is None  # srun makes the allocation: the run names the job


def test_torchrun_inside_srun_reads_torchrun_rank_first() -> None:
    env = {**TASK1, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    launch = identify((), env)
    assert launch.within == "srun" and launch.scheduler == SLURM
    assert (launch.rank, launch.world_size, launch.local_rank) == (3, 4, 1)
    assert launch.sources["rank"] == "RANK"
    assert launch.node == "n1"  # no torch variable names a node: SLURM's does


def test_pytorchjob_pod_with_no_launcher() -> None:
    launch = identify(["python", "train.py"], POD1)
    assert (launch.launcher, launch.within, launch.scheduler) == ("python", "pod", KUBERNETES)
    assert (launch.rank, launch.world_size) == (1, 2)
    # The job's name from the master replica's service name, ``<job>-master-0``.
    assert launch.job_name == "mnist-ddp" and launch.job_label == "mnist-ddp"
    assert launch.sources["job"] == "MASTER_ADDR"
    assert launch.per_task and launch.member == "rank1"
    assert launch.key == "pod:mnist-ddp@mnist-ddp-master-0:23456"


def test_pod_labels_name_the_job_before_the_master_address() -> None:
    labels = parse_labels(
        'training.kubeflow.org/job-name="resnet"\ntraining.kubeflow.org/replica-type="worker"\n'
    )
    assert labels["training.kubeflow.org/job-name"] == "resnet"
    launch = identify(["python", "train.py"], POD1, labels)
    assert launch.job_name == "resnet"
    assert launch.sources["job"] == "pod label training.kubeflow.org/job-name"
    jobset = identify((), {**POD1, "JOBSET_NAME": "js-1"}, labels)
    assert jobset.job_name == "js-1" and jobset.sources["job"] == "JOBSET_NAME"


def test_trainjob_master_address_names_the_job() -> None:
    env = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "PET_MASTER_ADDR": "llm-node-0-0.llm",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
    }
    launch = identify(["torchrun", "train.py"], env)
    assert launch.scheduler == KUBERNETES and launch.job_name == "llm"
    assert launch.node_rank == 1 and launch.sources["node_rank"] == "PET_NODE_RANK"


def test_master_address_pattern_outside_kubernetes_names_nothing() -> None:
    env = {k: v for k, v in POD1.items() if k != "KUBERNETES_SERVICE_HOST"}
    launch = identify(["python", "train.py"], env)
    assert (launch.within, launch.scheduler) == ("env", NONE)
    assert launch.job_name is None
    # Still one of two runs of one job: they meet under the master's address.
    assert launch.key == "pod:@mnist-ddp-master-0:23456" and launch.member == "rank1"


def test_single_rank_pod_is_not_per_task() -> None:
    launch = identify(["python", "t.py"], {**POD1, "RANK": "0", "WORLD_SIZE": "1"})
    assert not launch.per_task and launch.key is None


def test_torchrun_worker_environment() -> None:
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", GROUP_RANK="0")
    launch = identify((), env)
    assert (launch.within, launch.scheduler, launch.node_rank) == ("torchrun", NONE, 0)
    assert not launch.per_task  # torchrun's workers are one run's ranks


def test_plain_machine() -> None:
    launch = identify(["python", "train.py"], {"HOME": "/root"})
    assert (launch.launcher, launch.within, launch.scheduler) == ("python", None, NONE)
    assert launch.rank is None and launch.job_label is None and launch.sources == {}


def test_rank_from_env_for_the_probe() -> None:
    assert rank_from_env(TASK1) == (1, 2)
    assert rank_from_env({"RANK": "5", "WORLD_SIZE": "8"}) == (5, 8)
    assert rank_from_env(BATCH) == (None, None)
    assert rank_from_env({}) == (None, None)


def test_read_pod_labels_from_the_downward_api_file(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    path.write_text('app="x"\ntraining.kubeflow.org/job-name="bert-ft"\nquote="a\\"b"\n')
    labels = read_pod_labels({"AUDITOR_POD_LABELS": str(path)})
    assert labels == {"app": "x", "training.kubeflow.org/job-name": "bert-ft", "quote": 'a"b'}
    assert read_pod_labels({"AUDITOR_POD_LABELS": str(tmp_path / "none")}) == {}


def test_launcher_names_are_unique() -> None:
    names = [spec.name for spec in LAUNCHERS]
    assert len(names) == len(set(names))


def test_auditor_run_srun_over_several_nodes_is_told_what_it_cannot_hear() -> None:
    from auditor.launch_env import remote_ranks_note

    two = identify(["srun", "python", "t.py"], {**BATCH, "SLURM_JOB_NUM_NODES": "2"})
    note = remote_ranks_note(two)
    assert note is not None and "srun auditor run" in note
    one = identify(["srun", "python", "t.py"], {**BATCH, "SLURM_JOB_NUM_NODES": "1"})
    assert remote_ranks_note(one) is None
    # One auditor per task hears its own task wherever it runs.
    assert (
        remote_ranks_note(identify(["python", "t.py"], {**TASK1, "SLURM_JOB_NUM_NODES": "2"}))
        is None
    )


def test_accelerate_workers_are_named_before_the_torchrun_under_it() -> None:
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    env["ACCELERATE_MIXED_PRECISION"] = "no"
    assert identify((), env).within == "accelerate"


def test_the_docs_table_every_launcher() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "launchers.md").read_text()
    rows = {line.split("|")[1].strip() for line in docs.splitlines() if line.startswith("| `")}
    assert {f"`{spec.name}`" for spec in LAUNCHERS} | {"`python`"} <= rows


def test_a_rank_the_deepspeed_launcher_started() -> None:
    """What deepspeed.launcher.launch (DeepSpeed 0.19) hands each rank."""
    env = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "CROSS_RANK": "0",
        "CROSS_SIZE": "1",
        "LOCAL_SIZE": "2",
    }
    launch = identify((), env)
    assert (launch.within, launch.scheduler) == ("deepspeed", NONE)
    assert (launch.rank, launch.local_rank, launch.world_size) == (1, 1, 2)
    assert not launch.per_task
    assert command_launcher(["python", "-m", "deepspeed.launcher.runner", "t.py"]) == "deepspeed"
