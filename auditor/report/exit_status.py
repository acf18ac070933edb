"""``--fail-on``: the exit status that says "the job ran, and the verdict found something".

Shared by ``auditor run`` (the live job's final verdict) and ``auditor analyze`` (a recording's
verdict), so that a CI step can gate on the verdict alone and the code means the same in both.
"""

from __future__ import annotations

from auditor.report.model import Report

# Exit status of a run whose job succeeded but whose verdict has a finding at or above
# --fail-on. Not 1 (a job's own generic failure) nor 2 (a usage error).
FINDINGS_EXIT = 3
# Severities --fail-on accepts: an "info" finding is never a reason to fail a build.
FAIL_ON_SEVERITIES = ("warning", "critical")


def findings_fail(report: Report, fail_on: str | None) -> bool:
    """Whether the verdict has a finding at ``fail_on`` or worse (never when it is None)."""
    return fail_on is not None and any(f.at_least(fail_on) for f in report.findings)


def exit_status(code: int, report: Report, fail_on: str | None) -> int:
    """The command's exit status: ``code`` (the job's own, or the command's) when it is not 0,
    so a failed job's code comes through unchanged; else :data:`FINDINGS_EXIT` when the verdict
    fails ``fail_on``; else 0."""
    if code != 0:
        return code
    return FINDINGS_EXIT if findings_fail(report, fail_on) else 0
