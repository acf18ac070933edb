"""The model's forward is timed through its class's ``__call__``, for the model instance alone:
torch calls the model without its hook path (no hook of the probe's on it), another instance of
the class (a DataParallel replica, an EMA copy) and a copied or pickled model run as before, and
choosing another model gives the class back."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from auditor.probe.probe import Probe


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, fail: bool = False) -> torch.Tensor:
        if fail:
            raise RuntimeError("the forward failed")
        return self.fc(x)


class Other(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Recording(Probe):
    """A probe whose model-call handlers only record what they were called with."""

    calls: list[tuple[str, Any]]

    def _model_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        self.calls.append(("pre", module))

    def _model_post(self, module: Any, args: Any, output: Any) -> None:
        self.calls.append(("post", module))


@pytest.fixture
def probe(tmp_path: Path) -> Recording:
    p = Recording(torch, sink_path=str(tmp_path / "none.sock"), job="t")
    p.calls = []
    return p


def test_the_model_alone_is_timed_with_no_hook_on_it(probe: Recording) -> None:
    model, twin = Net(), Net()
    probe.set_model(model)
    try:
        # No hook on the model: torch takes its call's short path.
        assert not (model._forward_hooks or model._forward_pre_hooks)
        x = torch.ones(1, 2)
        assert torch.equal(model(x), model.fc(x))
        twin(x)
        assert probe.calls == [("pre", model), ("post", model)]
        # A forward that raises still ends.
        with pytest.raises(RuntimeError, match="the forward failed"):
            model(x, fail=True)
        assert probe.calls[-2:] == [("pre", model), ("post", model)]
        # An EMA copy and a pickled model are plain modules, called untimed.
        probe.calls.clear()
        copy.deepcopy(model)(x)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=False)(x)
        assert probe.calls == []
    finally:
        probe.set_model(Other())
    # Another model: the first one's class is as it was.
    assert "__call__" not in Net.__dict__
    model(torch.ones(1, 2))
    assert probe.calls == []
    probe.calls.clear()
    probe.model(torch.ones(1, 2))
    assert [c for c, _ in probe.calls] == ["pre", "post"]
    assert probe._untime_model is not None
    probe._untime_model()
    assert "__call__" not in Other.__dict__
