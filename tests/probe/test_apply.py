"""``auditor run --apply`` inside a rank: real DataLoaders built in this process with the plan in
the environment, through the probe's ``DataLoader.__init__`` patch (restored after each test)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from auditor.analysis.fixes import LOADER_LEVERS
from auditor.probe import apply
from auditor.probe.apply import RankPlan, changes, read_plan
from auditor.probe.patches.dataloader import _hook_apply

torch = pytest.importorskip("torch")
from torch import Tensor  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402


@dataclass
class FakeProbe:
    """What the patch reads and writes on the probe: enabled, the rank, what it applied."""

    rank_: int = 1
    enabled: bool = True
    applied: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    apply_kept: dict[str, str] = field(default_factory=dict)

    def rank(self) -> int:
        return self.rank_


class Stream(IterableDataset[Tensor]):
    def __iter__(self) -> Iterator[Tensor]:
        return iter(torch.arange(8.0).split(1))


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(64.0).reshape(32, 2))


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install the patch for a plan; DataLoader.__init__ is restored afterwards."""
    dl = importlib.import_module("torch.utils.data.dataloader")
    monkeypatch.setattr(dl.DataLoader, "__init__", dl.DataLoader.__init__)

    def install(
        levers: dict[str, dict[str, Any]],
        match: dict[str, dict[str, Any]] | None = None,
        rank: int = 1,
    ) -> FakeProbe:
        monkeypatch.setenv(apply.ENV_APPLY, json.dumps(levers))
        if match is not None:
            monkeypatch.setenv(apply.ENV_MATCH, json.dumps(match))
        else:
            monkeypatch.delenv(apply.ENV_MATCH, raising=False)
        probe = FakeProbe(rank_=rank)
        _hook_apply(probe, dl)  # type: ignore[arg-type]
        return probe

    yield install


def test_probe_levers_are_the_analysis_loader_levers() -> None:
    assert set(apply.LEVERS) == set(LOADER_LEVERS)


def test_the_named_rank_gets_the_levers(patched: Any) -> None:
    probe = patched({"1": {"num_workers": 2, "pin_memory": True}})
    loader = DataLoader(dataset(), batch_size=4, num_workers=0)
    assert loader.num_workers == 2 and loader.pin_memory is True
    assert loader.prefetch_factor == 2  # DataLoader's own default once it has workers
    assert probe.applied == {"num_workers": (0, 2), "pin_memory": (False, True)}
    assert probe.apply_kept == {}
    batches = list(loader)  # the rebuilt loader still loads, with its workers
    assert len(batches) == 8


def test_other_ranks_are_untouched(patched: Any) -> None:
    probe = patched({"1": {"num_workers": 2}}, rank=0)
    loader = DataLoader(dataset(), batch_size=4)
    assert loader.num_workers == 0
    assert probe.applied == {} and probe.apply_kept == {}


def test_positional_arguments_are_overridden_not_duplicated(patched: Any) -> None:
    patched({"1": {"num_workers": 1}})
    # dataset, batch_size, shuffle, sampler, batch_sampler, num_workers
    loader = DataLoader(dataset(), 4, False, None, None, 0)
    assert loader.num_workers == 1 and loader.batch_size == 4


def test_only_the_loader_matching_the_reports_training_loader(patched: Any) -> None:
    match = {"1": {"num_workers": 0, "batch_size": 4, "dataset": "TensorDataset"}}
    probe = patched({"1": {"num_workers": 2}}, match)
    train = DataLoader(dataset(), batch_size=4, shuffle=True)
    evaluation = DataLoader(dataset(), batch_size=16)
    assert train.num_workers == 2
    assert evaluation.num_workers == 0  # another batch size: not the loader that trained
    assert probe.applied == {"num_workers": (0, 2)}


def test_no_matching_loader_applies_nothing(patched: Any) -> None:
    probe = patched({"1": {"num_workers": 2}}, {"1": {"batch_size": 64}})
    loader = DataLoader(dataset(), batch_size=4)
    assert loader.num_workers == 0
    assert probe.applied == {}


def test_worker_levers_need_workers(patched: Any) -> None:
    probe = patched({"1": {"persistent_workers": True, "prefetch_factor": 4}})
    loader = DataLoader(dataset(), batch_size=4)  # num_workers=0 on purpose: left so
    assert loader.num_workers == 0 and loader.persistent_workers is False
    assert loader.prefetch_factor is None
    assert probe.applied == {}
    assert probe.apply_kept == {
        "persistent_workers": apply.NEEDS_WORKERS,
        "prefetch_factor": apply.NEEDS_WORKERS,
    }
    assert len(list(loader)) == 8


def test_worker_levers_with_workers(patched: Any) -> None:
    probe = patched({"1": {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 4}})
    loader = DataLoader(dataset(), batch_size=4)
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (1, True, 4)
    assert probe.applied == {
        "num_workers": (0, 1),
        "persistent_workers": (False, True),
        "prefetch_factor": (None, 4),
    }


def test_an_iterable_dataset_without_workers_keeps_them(patched: Any) -> None:
    probe = patched({"1": {"num_workers": 2, "prefetch_factor": 4, "pin_memory": True}})
    loader = DataLoader(Stream(), batch_size=2)
    assert loader.num_workers == 0 and loader.prefetch_factor is None
    assert loader.pin_memory is True  # valid on any loader
    assert probe.applied == {"pin_memory": (False, True)}
    assert probe.apply_kept == {
        "num_workers": apply.ITERABLE,
        "prefetch_factor": apply.NEEDS_WORKERS,
    }
    assert len(list(loader)) == 4  # the stream once, not once per worker


def test_a_value_already_set_is_left_alone(patched: Any) -> None:
    probe = patched({"1": {"num_workers": 1}})
    DataLoader(dataset(), batch_size=4, num_workers=1)
    assert probe.applied == {} and probe.apply_kept == {"num_workers": apply.ALREADY}


def test_a_refused_combination_leaves_the_loader_as_built(patched: Any) -> None:
    # A multiprocessing context needs workers: DataLoader itself refuses num_workers=0 with it.
    probe = patched({"1": {"num_workers": 0}})
    loader = DataLoader(dataset(), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert loader.num_workers == 1 and loader.multiprocessing_context is not None
    assert probe.applied == {} and probe.apply_kept == {"num_workers": apply.REFUSED}
    assert len(list(loader)) == 8


def test_the_scripts_own_errors_stay_its_own(patched: Any) -> None:
    patched({"1": {"num_workers": 2}})
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(dataset(), num_workers=0, prefetch_factor=2)


def test_no_plan_no_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    dl = importlib.import_module("torch.utils.data.dataloader")
    before = dl.DataLoader.__init__
    monkeypatch.delenv(apply.ENV_APPLY, raising=False)
    _hook_apply(FakeProbe(), dl)  # type: ignore[arg-type]
    assert dl.DataLoader.__init__ is before


def test_read_plan() -> None:
    env = {
        apply.ENV_APPLY: '{"1": {"num_workers": 7}, "3": {"pin_memory": true}}',
        apply.ENV_MATCH: '{"1": {"num_workers": 0, "sampler": "RandomSampler"}}',
    }
    assert read_plan(env) == {
        1: RankPlan({"num_workers": 7}, {"num_workers": 0}),  # the sampler is not matched
        3: RankPlan({"pin_memory": True}, {}),
    }
    assert read_plan({}) == {}
    with pytest.raises(ValueError, match="batch_size"):
        read_plan({apply.ENV_APPLY: '{"1": {"batch_size": 7}}'})


def test_lowering_workers_to_zero_drops_the_worker_levers() -> None:
    config = {"num_workers": 4, "persistent_workers": True, "prefetch_factor": 3}
    moves, kept = changes(RankPlan({"num_workers": 0}), config, iterable=False)
    assert moves == {
        "num_workers": (4, 0),
        "persistent_workers": (True, False),
        "prefetch_factor": (3, None),
    }
    assert kept == {}


def test_a_loader_lightning_rebuilds_gets_the_levers_too(patched: Any) -> None:
    """Lightning records a loader's arguments as the script gave them and rebuilds it with a
    DistributedSampler: the rebuilt loader, the one that trains, matches the report and is built
    with the levers (its sampler differs: plans never match on it)."""
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DistributedSampler

    match = {"1": {"num_workers": 0, "batch_size": 4, "dataset": "TensorDataset"}}
    probe = patched({"1": {"num_workers": 2, "persistent_workers": True}}, match)
    data = dataset()
    with _replace_dunder_methods(DataLoader, "dataset"):
        user = DataLoader(data, batch_size=4, shuffle=True)
    rebuilt = _update_dataloader(user, DistributedSampler(data, num_replicas=2, rank=1))
    assert type(rebuilt.sampler).__name__ == "DistributedSampler"
    assert (rebuilt.num_workers, rebuilt.persistent_workers, rebuilt.batch_size) == (2, True, 4)
    assert probe.applied == {"num_workers": (0, 2), "persistent_workers": (False, True)}
    assert len(list(rebuilt)) == 4


def test_what_was_applied_travels_in_the_ranks_info() -> None:
    from auditor.samples import RankInfo

    info = RankInfo(
        rank=1,
        world_size=2,
        applied=(("num_workers", 0, 2), ("pin_memory", False, True)),
        apply_kept=(("prefetch_factor", apply.NEEDS_WORKERS),),
    )
    wire = json.loads(json.dumps(info.to_dict()))
    assert wire["applied"] == [["num_workers", 0, 2], ["pin_memory", False, True]]
    assert RankInfo.from_dict(wire) == info
    # Without --apply the wire and recordings stay as they were.
    assert "applied" not in RankInfo(rank=0, world_size=1).to_dict()
    assert "apply_kept" not in RankInfo(rank=0, world_size=1).to_dict()
