"""How a job is opted in to the probe: its environment (the probe's boot folder first on
``PYTHONPATH``), and the file where a process whose probe could not attach says why.

``auditor run`` starts its job with :func:`probe_env`; ``auditor probe-path`` prints
:data:`BOOT_DIR` for jobs started some other way (``auditor fleet``'s nodes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from auditor.configs import ApplyPlan
from auditor.probe.apply import ENV_APPLY
from auditor.probe.apply import ENV_MATCH as ENV_APPLY_MATCH
from auditor.probe.importhook import ENV_ERRORS as ENV_PROBE_ERRORS

_AUDITOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOT_DIR = os.path.join(_AUDITOR_DIR, "probe", "boot")
PACKAGE_ROOT = os.path.dirname(_AUDITOR_DIR)


def probe_env(
    base: Mapping[str, str],
    *,
    sink: str,
    job: str,
    errors: str | None = None,
    apply: ApplyPlan | None = None,
) -> dict[str, str]:
    """The child's environment: the caller's, plus the probe's boot folder first on PYTHONPATH,
    the file where a rank whose probe cannot attach says why (:class:`ProbeErrors`), and the
    ``--apply`` plan for the ranks' DataLoaders (:mod:`auditor.probe.apply`; an inherited plan
    is dropped: only this run's applies)."""
    env = dict(base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = BOOT_DIR + (os.pathsep + path if path else "")
    env["AUDITOR_PROBE"] = "1"
    env["AUDITOR_SINK"] = sink
    env["AUDITOR_JOB"] = job
    env["AUDITOR_PROBE_ROOT"] = PACKAGE_ROOT
    if errors:
        env[ENV_PROBE_ERRORS] = errors
    env.pop(ENV_APPLY, None)
    env.pop(ENV_APPLY_MATCH, None)
    if apply is not None and apply.levers:
        env[ENV_APPLY] = json.dumps({str(r): v for r, v in sorted(apply.levers.items())})
        if apply.match:
            env[ENV_APPLY_MATCH] = json.dumps({str(r): v for r, v in sorted(apply.match.items())})
    return env


class ProbeErrors:
    """Why the probe did not attach in some process: the JSON lines such processes append to
    the run's file (``AUDITOR_PROBE_ERRORS``; a probe that failed may never reach the agent).
    Read as the run goes, for the live view, and once more at the end, for the report."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self.seen: dict[tuple[str, str], None] = {}  # (who, reason), in the order they came

    def poll(self) -> list[str]:
        """The new failures since the last poll, one line each."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._offset += end
        new = []
        for raw in data[:end].splitlines():
            try:
                entry = json.loads(raw)
                key = (str(entry["who"]), str(entry["reason"]))
            except (ValueError, KeyError, TypeError):
                continue
            if key not in self.seen:
                self.seen[key] = None
                new.append(f"{key[0]}: probe not attached: {key[1]}")
        return new

    def notes(self) -> list[str]:
        """One note per reason, naming every process it stopped (ranks first)."""
        by_reason: dict[str, list[str]] = {}
        for who, reason in self.seen:
            by_reason.setdefault(reason, []).append(who)
        return [
            f"probe not attached in {', '.join(sorted(whos, key=_ranks_first))}: {reason}"
            for reason, whos in by_reason.items()
        ]


def _ranks_first(who: str) -> tuple[int, int, str]:
    head, _, tail = who.partition(" ")
    if head == "rank" and tail.isdigit():
        return (0, int(tail), "")
    return (1, 0, who)
