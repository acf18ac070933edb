"""``--metrics-port``: per-rank Prometheus series from the node agent while the job runs, clean
under ``promtool check metrics``, bound to 127.0.0.1."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.metrics.catalog import BY_NAME
from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_for

from .conftest import REPO, base_env, torchrun

pytestmark = pytest.mark.e2e


def _with_verdict(url: str) -> str | None:
    """The endpoint's text once it carries the live data_starvation finding."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return text if "auditor_finding{" in text and 'kind="data_starvation"' in text else None


def test_metrics_served_while_the_job_runs(ray_address: str, tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "auditor", "run", "--address", ray_address, "--metrics-port", "0",
        "--live-interval", "1", "--report", str(tmp_path / "r.json"), "--",
        *torchrun("starved_rank.py", "--seconds", "25"),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env=base_env(), stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    url = None
    text = ""
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            m = re.search(r"metrics at (http://\S+)", line)
            if m:
                url = m.group(1)
            if url:
                # The live verdict reaches the agent's endpoint while the job trains (not on a
                # terminal the live view prints a line only every 10 s): poll the endpoint.
                text = wait_for(
                    partial(_with_verdict, url),
                    max(1.0, deadline - time.monotonic()),
                    what=f"the live data_starvation verdict at {url}",
                    every=0.5,
                )
                break
            assert time.monotonic() < deadline
        assert url is not None and url.startswith("http://127.0.0.1:")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)

    families = {f.name: f for f in text_string_to_metric_families(text)}
    steps = families["auditor_rank_steps"]  # the parser strips _total from counters
    ranks = {s.labels["rank"] for s in steps.samples if s.name.endswith("_total")}
    assert ranks == {"0", "1"}
    for s in steps.samples:
        assert s.labels["auditor_job"] == "starved_rank"
    phases = {
        s.labels["phase"]
        for s in families["auditor_rank_phase_seconds"].samples
        if s.labels["rank"] == "1"
    }
    assert {"data_wait", "forward", "backward", "optimizer", "collective_wait"} <= phases
    # Names come from the one catalog (counters appear without _total after parsing).
    for name in families:
        assert name in BY_NAME or f"{name}_total" in BY_NAME, name
    # The driver's live verdict is exported too.
    finding = [
        s for s in families["auditor_finding"].samples if s.labels["kind"] == "data_starvation"
    ]
    assert finding and finding[0].labels["rank"] == "1"
    promtool = require_tool("promtool")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0 and check.stdout.strip() == "" and check.stderr.strip() == "", (
        check.stdout + check.stderr
    )
