"""Put on PYTHONPATH by ``auditor run``: attaches the probe when the job imports torch.

It first runs whatever ``sitecustomize`` this one shadows (the environment's or the script's
own), so the job behaves exactly as without the auditor. Any failure here is swallowed: the job
must start even if the probe cannot. Why the probe did not start is one line appended to the
file ``AUDITOR_PROBE_ERRORS`` names (``auditor run`` sets it), which the run reports.
"""

import json
import os
import sys


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _start_probe() -> None:
    if os.environ.get("AUDITOR_PROBE", "") in ("", "0", "false", "no"):
        return
    try:
        from auditor.probe.importhook import install
    except ImportError:
        root = os.environ.get("AUDITOR_PROBE_ROOT")
        if not root:
            return
        sys.path.append(root)  # appended: never shadows the job's own packages
        from auditor.probe.importhook import install
    install()


def _say_not_attached(exc: BaseException) -> None:
    """One JSON line for ``auditor run``: who could not start the probe, and why. A copy of
    ``auditor.probe.importhook.say_not_attached``: importing the probe's package may be just
    what failed."""
    path = os.environ.get("AUDITOR_PROBE_ERRORS")
    if not path:
        return
    reason = f"{type(exc).__name__}: {exc}"
    shadow = sys.modules.get("auditor")
    where = getattr(shadow, "__file__", None) or ""
    root = os.environ.get("AUDITOR_PROBE_ROOT", "")
    if isinstance(exc, ImportError) and where and root and not where.startswith(root):
        reason += f" (the job's own module {where} shadows the auditor's package)"
    if "RANK" in os.environ:
        who = f"rank {os.environ['RANK']}"
    else:
        argv = getattr(sys, "argv", None) or ["python"]
        who = f"{os.path.basename(argv[0]) or 'python'} (pid {os.getpid()})"
    line = json.dumps({"who": who, "reason": " ".join(reason.split())}) + "\n"
    # One write with O_APPEND: lines from ranks starting together never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


try:
    _chain_next_sitecustomize()
except Exception as exc:
    # What Python itself prints when a sitecustomize fails: the job goes on either way.
    print(
        f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
        file=sys.stderr,
    )
try:
    _start_probe()
except Exception as exc:
    if os.environ.get("AUDITOR_DEBUG"):
        print(f"auditor: probe not started: {exc!r}", file=sys.stderr)
    try:
        _say_not_attached(exc)
    except Exception:
        pass  # nowhere to say it: the job goes on all the same
