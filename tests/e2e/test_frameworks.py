"""The jobs people run through a framework, each with the real package on CPU (tiny models built
from a config, nothing downloaded), under ``auditor run --report``: Lightning (``ddp`` and
``ddp_spawn``), the Hugging Face ``Trainer`` under torchrun, a plain ``accelerate launch`` loop,
Ray Train's ``TorchTrainer`` started by a script, FSDP2 ``fully_shard`` over gloo, and
``torch.multiprocessing.spawn``.

Each framework runs three times (``examples/frameworks/<script> --fault ...``): rank 1 starved
for data, rank 1 slow in forward, and balanced. Each run happens once per module (the
``framework_run`` cache) and every test below reads its report: the right finding on the right
rank, nothing above ``info`` blaming rank 0, no warning on the balanced run, and per-rank phases
that add up to the step, with whatever could not be hooked listed as not measured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.exits import ended_well, failure_text

from .conftest import REPO, Run, base_env, run_auditor

pytestmark = pytest.mark.e2e

FRAMEWORK_EXAMPLES = REPO / "examples" / "frameworks"
SEVERE = ("warning", "critical")
PHASES = ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "collective_wait_s")
# The probe names an unhooked phase by its hook where that differs from the report's field.
UNMEASURED_ALIASES = {"data_wait_s": ("data",)}
# Phases are exclusive and cover the step, but the report gives per-phase medians over the
# window: the sum of medians of parts sits near the median of their sum, not on it. Lightning's
# closure nesting once summed to 190% of the step; HF's gather booked as copy, 40% apart.
PHASE_SUM_TOLERANCE = 0.12
FAULTS = ("starved", "slow", "none")
STEPS = 60  # the examples' default


@dataclass(frozen=True)
class Framework:
    name: str
    command: tuple[str, ...]  # the launch, up to the script's own flags
    parallel_mode: str
    module: str  # the package the job needs (the test is skipped without it)
    env: tuple[tuple[str, str], ...] = ()


def _script(name: str) -> str:
    return str(FRAMEWORK_EXAMPLES / name)


FRAMEWORKS = {
    f.name: f
    for f in (
        Framework(
            "lightning_ddp",
            (sys.executable, _script("lightning_ddp.py"), "--strategy", "ddp"),
            "ddp",
            "lightning",
        ),
        Framework(
            "lightning_ddp_spawn",
            (sys.executable, _script("lightning_ddp.py"), "--strategy", "ddp_spawn"),
            "ddp",
            "lightning",
        ),
        Framework(
            "hf_trainer",
            ("torchrun", "--nproc_per_node=2", _script("hf_trainer.py")),
            "ddp",
            "transformers",
        ),
        Framework(
            "accelerate",
            # Every default spelled out: `accelerate launch` warns about each one left out.
            # --multi_gpu is accelerate's torchrun launcher; the script asks for the CPU.
            (
                "accelerate",
                "launch",
                "--multi_gpu",
                "--num_processes=2",
                "--num_machines=1",
                "--mixed_precision=no",
                "--dynamo_backend=no",
                _script("accelerate_loop.py"),
            ),
            "ddp",
            "accelerate",
        ),
        Framework(
            "ray_train",
            (sys.executable, _script("ray_train.py")),
            "ddp",
            "ray.train.torch",
            # The script starts its own local Ray (whose workers inherit the probe's
            # environment): never the session's, nor one a cluster test left recorded.
            (("RAY_ADDRESS", "local"),),
        ),
        Framework(
            "fsdp2",
            ("torchrun", "--nproc_per_node=2", _script("fsdp2.py")),
            "fsdp",
            "torch.distributed.fsdp",
        ),
        Framework("mp_spawn", (sys.executable, _script("mp_spawn.py")), "ddp", "torch"),
    )
}
NAMES = list(FRAMEWORKS)


@pytest.fixture(scope="module")
def framework_run(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, str], Run]]:
    """Runs a framework's example with a fault once per module; later calls get the same run."""
    done: dict[tuple[str, str], Run] = {}

    def get(name: str, fault: str) -> Run:
        if (name, fault) not in done:
            fw = FRAMEWORKS[name]
            pytest.importorskip(fw.module)
            env = base_env()
            env.update(fw.env)
            tmp = tmp_path_factory.mktemp(f"{name}-{fault}")
            done[name, fault] = run_auditor(
                ["--quiet", "--address", ray_address],
                [*fw.command, "--fault", fault, "--steps", str(STEPS)],
                tmp=tmp,
                env=env,
                timeout=240,
            )
        return done[name, fault]

    yield get


def _checked(run: Run) -> dict[str, Any]:
    assert run.report is not None, run.stderr[-4000:]
    ranks = run.report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], ranks
    # Every example trains STEPS steps on each rank: each rank's own, none booked to another
    # (the last one may still be open when a worker is ended).
    trained = all(STEPS - 2 <= r["steps"] <= STEPS for r in ranks)
    assert ended_well(run.returncode, run.stderr, finished=trained), failure_text(
        run.stderr, tail=4000
    )
    assert trained, [r["steps"] for r in ranks]
    return run.report


def _no_warning_blames_rank_0(report: dict[str, Any]) -> None:
    for f in report["findings"]:
        if f["severity"] in SEVERE:
            assert 0 not in f["ranks"], f


def _blamed(report: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["kind"] == kind]
    assert found, (
        f"no {kind}: {[(f['kind'], f['severity'], f['ranks']) for f in report['findings']]}"
    )
    return found[0]


@pytest.mark.parametrize("name", NAMES)
def test_starved_rank_is_named(name: str, framework_run: Callable[[str, str], Run]) -> None:
    report = _checked(framework_run(name, "starved"))
    f = _blamed(report, "data_starvation")
    assert f["ranks"] == [1], f
    assert f["severity"] in SEVERE, f
    assert "1" in f["fixes"], f  # fixes by rank
    _no_warning_blames_rank_0(report)
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[1]["data_wait_s"] > 2 * by_rank[0]["data_wait_s"], by_rank


@pytest.mark.parametrize("name", NAMES)
def test_slow_rank_is_named(name: str, framework_run: Callable[[str, str], Run]) -> None:
    report = _checked(framework_run(name, "slow"))
    f = _blamed(report, "compute_straggler")
    assert f["ranks"] == [1], f
    assert f["severity"] in SEVERE, f
    _no_warning_blames_rank_0(report)
    # The sleep is in forward: rank 1's forward is the longer one, rank 0 waits at a collective.
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[1]["forward_s"] > by_rank[0]["forward_s"], by_rank
    assert by_rank[0]["collective_wait_s"] > by_rank[1]["collective_wait_s"], by_rank


@pytest.mark.parametrize("name", NAMES)
def test_balanced_run_gets_no_warning(name: str, framework_run: Callable[[str, str], Run]) -> None:
    report = _checked(framework_run(name, "none"))
    severe = [
        (f["kind"], f["severity"], f["ranks"])
        for f in report["findings"]
        if f["severity"] in SEVERE
    ]
    assert severe == []


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", NAMES)
def test_phases_add_up_to_the_step(
    name: str, fault: str, framework_run: Callable[[str, str], Run]
) -> None:
    report = _checked(framework_run(name, fault))
    assert report["job"]["parallel_mode"] == FRAMEWORKS[name].parallel_mode
    for r in report["ranks"]:
        assert r["parallel_mode"] == FRAMEWORKS[name].parallel_mode, r
        missing = [p for p in PHASES if r[p] is None]
        # A phase the probe could not hook is listed as not measured, never guessed.
        for p in missing:
            names = {p.removesuffix("_s"), *UNMEASURED_ALIASES.get(p, ())}
            assert names & set(r["unmeasured"]), (p, r["unmeasured"])
        # The collective wait is what tells waiting from work: every framework here is hooked.
        assert r["collective_wait_s"] is not None, r["unmeasured"]
        parts = {p: r[p] for p in PHASES if r[p] is not None}
        total = sum(parts.values())
        step = r["step_s"]
        assert abs(total - step) <= PHASE_SUM_TOLERANCE * step, (
            f"rank {r['rank']}: phases sum to {total * 1e3:.1f} ms of a {step * 1e3:.1f} ms "
            f"step ({total / step:.0%}): { {p: round(v * 1e3, 1) for p, v in parts.items()} }"
        )
        # CPU jobs copy nothing to a device: the copy phase holds no waits.
        assert r["h2d_s"] is None or r["h2d_s"] <= 0.05 * step, r


def test_validation_loader_is_not_taken_for_the_training_loader(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Lightning validates every 10 steps on a loader with 2 workers while rank 1's training
    loader (no workers) starves it: the fix starts from the training loader's num_workers 0,
    not from the validation loader iterated last (which read "num_workers 2 -> 6")."""
    pytest.importorskip("lightning")
    fw = FRAMEWORKS["lightning_ddp"]
    val = ("--val-every", "10", "--val-workers", "2")
    run = run_auditor(
        ["--quiet", "--address", ray_address],
        [*fw.command, "--fault", "starved", "--steps", str(STEPS), *val],
        tmp=tmp_path_factory.mktemp("lightning-val"),
        env=base_env(),
        timeout=240,
    )
    report = _checked(run)
    f = _blamed(report, "data_starvation")
    assert f["ranks"] == [1], f
    assert f["severity"] in SEVERE, f
    assert f["fixes"]["1"].startswith("num_workers 0 -> "), f["fixes"]
    _no_warning_blames_rank_0(report)
    for r in report["ranks"]:
        assert r["loader"]["num_workers"] == 0, r["loader"]


def test_batch_advice_under_gradient_accumulation_is_per_micro_batch(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Lightning with ``accumulate_grad_batches=4``, micro-batches of 8, rank 1 slow in forward:
    a step (optimizer step) holds 32 samples, but the user sets ``batch_size`` 8, so the
    straggler's fix speaks of 8 per micro-batch (it said "batch_size 32 -> 14")."""
    pytest.importorskip("lightning")
    fw = FRAMEWORKS["lightning_ddp"]
    steps = 20
    run = run_auditor(
        ["--quiet", "--address", ray_address],
        [*fw.command, "--fault", "slow", "--steps", str(steps), "--accumulate", "4"],
        tmp=tmp_path_factory.mktemp("lightning-accumulate"),
        env=base_env(),
        timeout=240,
    )
    report = run.report
    assert report is not None, run.stderr[-4000:]
    trained = all(steps - 2 <= r["steps"] <= steps for r in report["ranks"])
    assert ended_well(run.returncode, run.stderr, finished=trained), failure_text(
        run.stderr, tail=4000
    )
    assert trained, [r["steps"] for r in report["ranks"]]
    for r in report["ranks"]:
        assert r["batch_size"] == 32, r  # samples per optimizer step
    f = _blamed(report, "compute_straggler")
    assert f["ranks"] == [1], f
    fix = f["fixes"]["1"]
    assert "batch_size 8 -> " in fix and "(per micro-batch; 4 accumulated per step)" in fix, fix
    assert "batch_size 32" not in fix, fix
    _no_warning_blames_rank_0(report)
