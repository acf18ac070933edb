"""auditor.torchrun: what a launch command says about its job, for the DeepSpeed launcher
(torchrun's own cases are in tests/report/test_live_panel.py and tests/cluster/test_jobview.py).

The DeepSpeed commands are the ones its runner (``deepspeed.launcher.runner``) accepts; the
counts are the ranks it starts from them (``apply_num_nodes_and_gpus``, ``--include``'s slots).
"""

from __future__ import annotations

import pytest

from auditor.torchrun import deepspeed_args, expected_ranks, node_rank


@pytest.mark.parametrize(
    ("command", "ranks"),
    [
        (["deepspeed", "--num_gpus=2", "train.py"], 2),
        (["deepspeed", "--num_gpus", "8", "train.py", "--num_gpus", "1"], 8),
        (["deepspeed", "--num_accelerators=4", "train.py"], 4),
        (["deepspeed", "--num_nodes=2", "--num_gpus=4", "-H", "hosts", "train.py"], 8),
        (["deepspeed", "--no_local_rank", "--num_gpus", "2", "train.py"], 2),
        (["deepspeed", "-i", "localhost:0,1", "train.py"], 2),
        (["deepspeed", "--include=worker-0:0,2@worker-1:1", "train.py"], 3),
        (["/opt/venv/bin/deepspeed", "--num_gpus=3", "--module", "pkg.train"], 3),
        (["python", "-m", "deepspeed.launcher.runner", "--num_gpus=2", "t.py"], 2),
        (["env", "NCCL_DEBUG=INFO", "deepspeed", "--num_gpus=2", "t.py"], 2),
        # What the machine decides: its GPU count, a hostfile's hosts, an excluded slot.
        (["deepspeed", "train.py"], None),
        (["deepspeed", "--hostfile=hosts", "--num_gpus=2", "train.py"], None),
        (["deepspeed", "-i", "worker-0@worker-1:0", "train.py"], None),
        (["deepspeed", "-e", "localhost:0", "train.py"], None),
        (["deepspeed", "--num_gpus=many", "train.py"], None),
    ],
)
def test_expected_ranks_of_a_deepspeed_launch(command: list[str], ranks: int | None) -> None:
    assert expected_ranks(command) == ranks


def test_deepspeed_options_stop_at_the_script() -> None:
    opts = deepspeed_args(["deepspeed", "--no_ssh", "--master_port", "29600", "t.py", "--x=1"])
    assert opts == {"no_ssh": "", "master_port": "29600"}
    assert deepspeed_args(["torchrun", "--nproc_per_node=2", "t.py"]) is None
    assert deepspeed_args(["python", "t.py"]) is None


def test_node_rank_of_a_deepspeed_node_launched_without_ssh() -> None:
    cmd = ["deepspeed", "-H", "hosts", "--no_ssh", "--node_rank=1", "--master_addr=h0", "t.py"]
    assert node_rank(cmd, {}) == 1
    # The runner's default (-1) says nothing: the environment may.
    assert node_rank(["deepspeed", "--num_gpus=2", "t.py"], {"NODE_RANK": "2"}) == 2
    assert node_rank(["deepspeed", "--num_gpus=2", "t.py"], {}) is None
