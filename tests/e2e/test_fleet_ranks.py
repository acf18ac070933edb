"""Jobs an operator never launches: two torchrun jobs opted in with ``AUDITOR_PROBE=1`` only (no
``auditor run``), on a node where ``auditor fleet`` runs. Their ranks reach the fleet's node
agent on the probe's default socket and come out of its endpoint apart, rank 0 of each job
labelled with its own job -- the series ``auditor serve`` audits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cluster.probing import BOOT_DIR
from auditor.probe.probe import default_sink_path
from tests.helpers.waiting import wait_for_service

from .conftest import EXAMPLES, REPO, base_env

pytestmark = pytest.mark.e2e


def _series(url: str) -> dict[tuple[str, str, str], float]:
    """``(metric, job, rank) -> value`` of the rank series an endpoint serves now."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "rank" in s.labels and s.name.startswith("auditor_rank_"):
                out[(s.name, s.labels["auditor_job"], s.labels["rank"])] = s.value
    return out


def test_fleet_agent_takes_the_ranks_of_every_opted_in_job(
    tmp_path: Path, ray_address: str
) -> None:
    sd = tmp_path / "sd.json"
    log = tmp_path / "fleet.log"
    fleet = subprocess.Popen(
        [sys.executable, "-m", "auditor", "fleet", "--address", ray_address, "--sd-file", str(sd)],
        cwd=REPO,
        env=base_env(),
        stdout=open(log, "w"),  # noqa: SIM115 (closed when the process ends)
        stderr=subprocess.STDOUT,
    )
    jobs: list[subprocess.Popen[bytes]] = []
    try:

        def listed() -> str | None:
            if not sd.exists() or not Path(default_sink_path()).exists():
                return None
            entries = json.loads(sd.read_text() or "[]")
            return entries[0]["targets"][0] if entries and entries[0]["targets"] else None

        target = wait_for_service(listed, timeout=120, what=f"the fleet's endpoint ({log})")
        url = f"http://{target}/metrics"
        env = {**base_env(), "AUDITOR_PROBE": "1", "PYTHONPATH": str(BOOT_DIR)}
        env.pop("AUDITOR_SINK", None)
        env.pop("AUDITOR_JOB", None)
        for script in ("train_ddp.py", "starved_rank.py"):
            jobs.append(
                subprocess.Popen(
                    [
                        "torchrun",
                        "--standalone",
                        "--nproc_per_node=2",
                        str(EXAMPLES / script),
                        "--seconds",
                        "15",
                    ],
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
        want = {(job, rank) for job in ("train_ddp", "starved_rank") for rank in ("0", "1")}

        def all_ranks_stepping() -> dict[tuple[str, str, str], float] | None:
            got = _series(url)
            stepping = {(j, r) for (m, j, r), v in got.items() if m.endswith("steps_total") and v}
            return got if want <= stepping else None

        series = wait_for_service(
            all_ranks_stepping, timeout=150, what="4 ranks of 2 jobs", every=1
        )
        # Rank 0 of each job is its own series, labelled with the script's name as its job.
        assert {(j, r) for (m, j, r) in series if m == "auditor_rank_up"} == want
        for job in jobs:
            _, err = job.communicate(timeout=120)
            assert job.returncode == 0, err.decode()[-2000:]
        ended = wait_for_service(
            lambda: all(_series(url).get(("auditor_rank_up", j, r)) == 0 for j, r in want),
            timeout=30,
            what="rank_up 0 for every rank once the jobs ended",
        )
        assert ended
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
        fleet.send_signal(signal.SIGINT)
        code = fleet.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
