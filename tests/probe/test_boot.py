"""Getting the probe into a process: the boot ``sitecustomize`` (chaining to the job's own),
the ``AUDITOR_PROBE`` switch, and the one-line ``import auditor.probe.auto`` opt-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import BOOT, TRAIN, clean_env, run_job

# Prints what the probe did to this process, without importing torch unless asked to.
REPORT = """
import os, sys
print("ENV", os.environ.get("USER_SITE_RAN"))
print("AUDITOR_IMPORTED", "auditor" in sys.modules)
print("TORCH_IMPORTED", "torch" in sys.modules)
watching = any(getattr(f, "name", None) == "torch" for f in sys.meta_path)
print("WATCHING", watching)
if "--torch" in sys.argv:
    import torch
    from auditor.probe import hooks
    print("ATTACHED", hooks.current() is not None)
    next_ = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    backward = torch.autograd.backward
    print("PATCHED", hasattr(next_, "__wrapped__") or hasattr(backward, "__wrapped__"))
print("JOB-RAN")
"""


def python(
    pythonpath: list[Path], probe: str | None, *args: str
) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    if pythonpath:
        env["PYTHONPATH"] = ":".join(str(p) for p in pythonpath)
    if probe is not None:
        env["AUDITOR_PROBE"] = probe
    return subprocess.run(
        [sys.executable, "-c", REPORT, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(out: str) -> dict[str, str]:
    return dict(ln.split(" ", 1) for ln in out.splitlines() if " " in ln)


def user_site(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "usersite"
    d.mkdir()
    (d / "sitecustomize.py").write_text(body)
    return d


def test_the_jobs_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    user = user_site(
        tmp_path,
        "import os, sys\n"
        "os.environ['USER_SITE_RAN'] = 'yes'\n"
        "print('USER-SITECUSTOMIZE-MARKER', file=sys.stderr)\n",
    )
    audited = python([BOOT, user], "1")
    bare = python([user], None)
    assert audited.returncode == bare.returncode == 0
    assert audited.stderr == bare.stderr == "USER-SITECUSTOMIZE-MARKER\n"
    got = lines(audited.stdout)
    assert got["ENV"] == "yes"
    assert got["WATCHING"] == "True"  # armed, waiting for the job's own import torch
    assert got["TORCH_IMPORTED"] == "False"  # the probe never imports torch itself
    assert "JOB-RAN" in audited.stdout


@pytest.mark.parametrize(
    "body",
    ["raise RuntimeError('boom in the user sitecustomize')\n", "import no_such_module_xyz\n"],
    ids=["raises", "bad-import"],
)
def test_failing_sitecustomize_reports_like_python_and_the_job_goes_on(
    tmp_path: Path, body: str
) -> None:
    user = user_site(tmp_path, body)
    bare = python([user], None)
    assert bare.stderr.startswith("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n")
    audited = python([BOOT, user], "1", *(["--torch"] if "boom" in body else []))
    assert audited.returncode == bare.returncode == 0
    assert audited.stderr == bare.stderr  # the very line Python prints
    got = lines(audited.stdout)
    assert "JOB-RAN" in audited.stdout
    if "boom" in body:
        assert got["ATTACHED"] == "True" and got["PATCHED"] == "True"  # the probe still starts
    else:
        assert got["WATCHING"] == "True"


def test_probe_off_without_auditor_probe() -> None:
    off = python([BOOT], "0")
    assert off.returncode == 0 and off.stderr == ""
    got = lines(off.stdout)
    assert got["WATCHING"] == "False"
    assert got["AUDITOR_IMPORTED"] == "False"  # not even the package is imported
    unset = python([BOOT], None, "--torch")
    assert unset.returncode == 0, unset.stderr
    got = lines(unset.stdout)
    assert got["WATCHING"] == "False"
    assert got["ATTACHED"] == "False" and got["PATCHED"] == "False"


@pytest.mark.parametrize("where", ["before", "after"])
def test_auto_import_opts_in_without_the_boot_folder(where: str) -> None:
    res = run_job(
        [str(TRAIN), f"--auto={where}", "--loader", "--batches=3", "--batch=2"], boot=False
    )
    assert res.returncode == 0, res.stderr
    assert res.printed("MATCH") == "True"
    assert [s.step for s in res.steps] == [0, 1, 2]
    assert all(s.batch_size == 2 and s.forward_s > 0 for s in res.steps)
    assert res.infos[0].pid == res.pid and res.infos[0].parallel_mode == "none"
