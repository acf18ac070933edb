"""Each rank's account in the report: the JSON ``time`` block (read back as written; reports
from before it still read), the verdict's line on the largest loss and the per-rank lines, and
the HTML page's stacked bar per rank."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from auditor.analysis.accounting import Account, Loss
from auditor.analysis.snapshot import SampleStore
from auditor.report.figures import time_figure
from auditor.report.html import render_html
from auditor.report.json_report import make_report
from auditor.report.model import Report
from auditor.report.terminal import render_verdict
from auditor.report.time_account import loss_sentence, rank_line
from auditor.samples import Batch, RankInfo, StepSample

T0 = 1_700_000_000.0


def checkpointing_store() -> SampleStore:
    """Two ranks, 60 steps of 100 ms; rank 0 saves a 1 s checkpoint every 20 steps and rank 1
    waits for it at the next all-reduce; both took 2 s to start and 0.3 s to end."""
    store = SampleStore("ckpt")
    for rank in (0, 1):
        t, rows = T0 + 2.0, []
        for i in range(60):
            save = 1.0 if (i + 1) % 20 == 0 else 0.0
            t += 0.1 + save
            rows.append(
                StepSample(
                    rank=rank,
                    step=i,
                    time=t,
                    step_s=0.1 + save,
                    data_wait_s=0.01,
                    forward_s=0.03,
                    backward_s=0.04,
                    optimizer_s=0.01,
                    collective_wait_s=0.005 + (save if rank == 1 else 0.0),
                    outside={"checkpoint": save} if save and rank == 0 else None,
                )
            )
        info = RankInfo(rank=rank, world_size=2, host="h", started_at=T0, ended_at=t + 0.3)
        store.add(Batch(infos=(info,), steps=tuple(rows)))
    return store


def report() -> Report:
    store = checkpointing_store()
    snap = store.snapshot(T0 + 100, None)
    return make_report(
        command=["train.py"], exit_code=0, duration_s=11.0, snapshot=snap, findings=[]
    )


def test_the_json_time_block_adds_up_and_reads_back() -> None:
    rep = report()
    doc = json.loads(json.dumps(rep.to_dict()))
    time0 = doc["ranks"][0]["time"]
    assert time0["outside"] == {"checkpoint": 3.0}
    assert time0["startup_s"] == 2.0 and time0["teardown_s"] == 0.3
    parts = [v for k, v in time0.items() if k.endswith("_s") and k != "wall_s"]
    booked = sum(parts) + sum(time0["outside"].values())
    assert abs(booked - time0["wall_s"]) <= 0.02 * time0["wall_s"]
    assert Report.from_dict(doc) == rep


def test_an_older_report_without_the_block_still_reads() -> None:
    doc = report().to_dict()
    for r in doc["ranks"]:
        del r["time"]
    old = Report.from_dict(doc)
    assert all(r.time is None for r in old.ranks)
    text = render_verdict(old)
    assert "Largest loss" not in text and "Where the time went" not in text


def test_the_verdict_leads_with_the_largest_loss() -> None:
    # Wrapped at 80 columns; continuation lines are indented: join them back.
    lines = re.sub(r"\n +(?=\S)(?!rank \d)", " ", render_verdict(report())).splitlines()
    assert lines[0].startswith("Verdict:")
    assert lines[1] == (
        "Largest loss: rank 0 spent 3.0s (27% of its run) saving checkpoints while rank 1 waited."
    )
    at = lines.index("Where the time went (whole run, every second once):")
    rank0, rank1 = lines[at + 1], lines[at + 2]
    assert rank0.startswith("  rank 0: 11.3s = start-up 2.0s, 60 steps 9.0s (checkpoint 3.0s")
    assert rank0.endswith("teardown 0.30s")
    assert rank1.startswith("  rank 1: 11.3s = start-up 2.0s, 60 steps 9.0s (waiting for peers")


def test_the_page_has_a_stacked_bar_per_rank_and_the_loss() -> None:
    rep = report()
    fig = time_figure(rep.sorted_ranks)
    assert fig is not None
    bars = {t.name: list(t.x) for t in fig.data if t.type == "bar"}
    assert bars["checkpoint"] == [3.0, 0.0]
    assert bars["start-up"] == [2.0, 2.0]
    assert set(bars) >= {"start-up", "forward", "waiting for peers", "teardown"}
    page = render_html(rep)
    assert 'id="plot-run-time"' in page
    assert 'id="largest-loss"' in page and "saving checkpoints while rank 1 waited" in page


def test_a_loss_every_rank_shares_is_worded_for_them_together() -> None:
    alike = Loss("startup", 0, 20.2, 0.6, (), (1, 2, 3))
    assert loss_sentence(alike) == (
        "ranks 0, 1, 2, 3 each spent up to 20.2s (60% of the run) starting up before the first step"
    )
    data = Loss("data_wait", 1, 0.42, 0.12, (0,))
    assert (
        loss_sentence(data)
        == "rank 1 spent 0.42s (12% of its run) waiting for data while rank 0 waited"
    )
    assert (
        loss_sentence(Loss("compile", 2, 75.0, 0.5))
        == "rank 2 spent 1m15s (50% of its run) on compile"
    )


def test_gpu_memory_held_while_starting_up_and_ending_is_said_there() -> None:
    a = Account(
        rank=0,
        wall_s=30.0,
        startup_s=12.0,
        steps=100,
        forward_s=17.0,
        teardown_s=1.0,
        startup_gpu_bytes=1.5 * 1024**3,
        teardown_gpu_bytes=3 * 1024**3,
    )
    assert rank_line(a) == (
        "rank 0: 30.0s = start-up 12.0s (GPU memory held 1.5 GiB), 100 steps 17.0s "
        "(forward 17.0s), teardown 1.0s (GPU memory held 3.0 GiB)"
    )
    plain = replace(a, startup_gpu_bytes=None, teardown_gpu_bytes=None)
    assert "GPU memory" not in rank_line(plain)
