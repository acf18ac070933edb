"""Installing the auditor into a training environment changes nothing that was already there.

Users ``pip install`` the auditor next to their training job's own packages; requests, botocore
and Ray import ``urllib3`` there. grafana-client once brought niquests, whose urllib3-future
replaced that ``urllib3`` module behind pip's back (``pip show urllib3`` said 2.7.0 while
``import urllib3`` gave 2.25.904). The e2e test installs the package for real into a fresh
virtualenv holding requests, and compares before and after; the fast one checks that only
``auditor serve`` needs the ``[serve]`` extra (orjson, numpy).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECORDING = REPO / "tests/data/balanced_4gpu/recording.jsonl"
# What requests and everything built on it import, and from where.
URLLIB3_PROBE = (
    "import urllib3, requests; print(urllib3.__version__, urllib3.__file__, requests.__version__)"
)
# Never to be pulled in by the core install: torch is the user's own build (several GB of CUDA
# wheels otherwise); the others replace urllib3 or belong to the [serve] extra.
NEVER_PULLED = ("torch", "urllib3-future", "niquests", "grafana-client", "orjson")
SERVE_EXTRA = ("orjson", "numpy")


def _env() -> dict[str, str]:
    """This process' environment without what would let the venv see this checkout or this
    interpreter's packages (pip's own configuration stays: it names the registry)."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` in ``cwd`` (not the checkout: ``python -m`` puts the current directory on
    sys.path), failing the test with its output if it fails."""
    proc = subprocess.run(
        argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _distributions(python: str, cwd: Path) -> dict[str, str]:
    """Every installed distribution's normalised name and version, as pip lists them."""
    listed = json.loads(_run([python, "-m", "pip", "list", "--format=json"], cwd).stdout)
    return {d["name"].lower().replace("_", "-"): d["version"] for d in listed}


def _sources(dest: Path) -> Path:
    """The files a wheel is built from, copied: building in the checkout would leave build/
    and an egg-info behind in a working tree others are using."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dest / name)
    shutil.copytree(
        REPO / "auditor", dest / "auditor", ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_installing_changes_nothing_already_installed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    work = tmp_path / "work"
    work.mkdir()
    _run([sys.executable, "-m", "venv", str(venv)], work)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "requests"], work)
    before_import = _run([python, "-c", URLLIB3_PROBE], work).stdout
    before = _distributions(python, work)
    assert str(venv) in before_import, before_import

    started = time.monotonic()
    src = _sources(tmp_path / "src")
    _run([python, "-m", "pip", "install", "-q", str(src)], work, timeout=840)
    print(f"pip install took {time.monotonic() - started:.0f} s")

    _run([python, "-m", "pip", "check"], work)
    after_import = _run([python, "-c", URLLIB3_PROBE], work).stdout
    assert after_import == before_import, f"before: {before_import}after: {after_import}"
    after = _distributions(python, work)
    changed = {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}
    assert not changed, f"the install changed (before, after): {changed}"
    assert "gpu-balance-auditor" in after
    pulled = sorted(set(NEVER_PULLED) & set(after))
    assert not pulled, f"the core install pulled in {pulled}"

    # The installed copy, not this checkout, answers.
    where = _run([python, "-c", "import auditor; print(auditor.__file__)"], work).stdout
    assert where.startswith(str(venv)), where
    assert (
        "Audit multi-GPU PyTorch training" in _run([python, "-m", "auditor", "--help"], work).stdout
    )
    # The core commands need no extra: a recording is judged as on any training node.
    analysed = _run([python, "-m", "auditor", "analyze", str(RECORDING), "--json"], work).stdout
    assert json.loads(analysed)["job"]["world_size"] == 4
    # auditor serve without its extra: one line naming it, no traceback.
    proc = subprocess.run(
        [python, "-m", "auditor", "serve", "--once"],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.rstrip().endswith("pip install gpu-balance-auditor[serve]"), proc.stderr


def test_only_auditor_serve_needs_the_serve_extra() -> None:
    """Every module imports without orjson and numpy except the service's own, its command and
    the Prometheus client with its answer decoder (auditor serve checks for them first and
    names the extra)."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"for name in {SERVE_EXTRA!r}:\n"
        "    sys.modules[name] = None  # import raises ImportError\n"
        "import auditor\n"
        "for m in pkgutil.walk_packages(auditor.__path__, 'auditor.'):\n"
        "    if m.name != 'auditor.__main__':\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except ImportError:\n"
        "            print(m.name)\n"
    )
    proc = _run([sys.executable, "-c", code], REPO, timeout=120)
    needing = set(proc.stdout.split())
    assert needing, "the check found nothing: are orjson and numpy still blocked?"
    theirs = {
        m for m in needing if m.startswith("auditor.service") or m == "auditor.commands.serve"
    }
    assert needing - theirs == {"auditor.metrics.query", "auditor.metrics.promvector"}
