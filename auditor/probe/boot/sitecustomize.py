"""Put on PYTHONPATH by ``auditor run``: attaches the probe when the job imports torch.

It first runs whatever ``sitecustomize`` this one shadows (the environment's or the script's
own), so the job behaves exactly as without the auditor. Any failure here is swallowed: the job
must start even if the probe cannot.
"""

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
