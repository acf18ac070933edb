"""A trimmed Ray for the GPU machine, small enough to travel with the working tree.

    python bench/ray_bundle.py [--python 3.12] [--out .raybundle] [--print-install]

The GPU machine has Python and torch but no Ray and no package registry; it gets only the
repository's working tree and a few carried paths (64 MiB in all). Ray's wheel unpacks to about
200 MB; most of it is never imported by what ``auditor run`` does with Ray (``ray.init`` of a
local Ray, the node agent and the GPU monitors as actors): the Java jars, the dashboard's web
client, and the libraries on top of Ray core (RLlib, Data, Serve, Tune, Train, LLM, ...).

This downloads (``pip download --no-deps --only-binary``, for CPython ``--python`` on
manylinux x86_64) the Ray of this machine and the packages its core needs that the GPU image
lacks (:data:`DEPS`), unpacks Ray, drops :data:`DROP`, and writes into ``--out``:

* ``ray-cp312.tar.xz``: the trimmed Ray (``ray/`` and its dist-info), to unpack into a
  site folder; the executables (``raylet``, ``gcs_server``) keep their mode;
* the dependencies' wheels, as downloaded, to install with ``pip --no-index --no-deps``.

It prints what it kept and dropped and the sizes. ``--print-install`` prints the one line that
installs the bundle on the GPU machine (run from the repository root; then ``ray`` imports from
``/tmp/site``). Add ``/.raybundle/`` to ``.git/info/exclude`` (done here) so the bundle is never
committed but can be carried.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What Ray's core needs and the GPU image lacks (it has click, filelock, msgpack, packaging,
# protobuf, pyyaml, requests, grpcio, aiohttp and its dependencies, psutil, prometheus-client,
# attrs, numpy): jsonschema (runtime_env validation) and its dependencies.
DEPS = ("jsonschema", "jsonschema-specifications", "referencing", "rpds-py")

# Never imported by ray.init(), actors and a local Ray's own processes (raylet, GCS, the
# dashboard agent and the runtime-env agent, the autoscaler monitor). The dashboard's Python is
# kept: the raylet starts the dashboard agent from it; so is ray/widgets (ray._private.worker
# imports it).
DROP = (
    "ray/jars",  # Java workers
    "ray/dashboard/client",  # the dashboard's web client (its build)
    "ray/rllib",
    "ray/data",
    "ray/serve",
    "ray/tune",
    "ray/train",
    "ray/llm",
    "ray/air",
    "ray/workflow",
    "ray/setup-dev.py",
)

PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")


def tag(python: str) -> str:
    return "cp" + python.replace(".", "")


def archive_name(python: str) -> str:
    return f"ray-{tag(python)}.tar.xz"


def install_line(out: str = ".raybundle", python: str = "3.12", site: str = "/tmp/site") -> str:
    """The one shell line that installs the bundle (from the repository root)."""
    return (
        f"mkdir -p {site} && python3 -m tarfile --filter tar -e {out}/{archive_name(python)} "
        f"{site} && python3 -m pip install -q --no-index --no-deps --no-compile --target {site} "
        f"{out}/*.whl && export PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}}"
    )


def download(spec: list[str], python: str, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp",
           *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(dest), *spec]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def exclude_from_git(out: Path) -> None:
    """``/<out>/`` in ``.git/info/exclude`` when ``out`` lies in this repository."""
    try:
        rel = out.resolve().relative_to(REPO)
    except ValueError:
        return
    info = REPO / ".git" / "info"
    if not info.is_dir():
        return
    exclude = info / "exclude"
    line = f"/{rel.as_posix()}/"
    have = exclude.read_text().splitlines() if exclude.exists() else []
    if line not in have:
        with open(exclude, "a") as f:
            f.write(line + "\n")


def build(python: str, out: Path, cache: Path, shown: str) -> int:
    version = ray_version()
    cache.mkdir(parents=True, exist_ok=True)
    download([f"ray=={version}"], python, cache)
    t = tag(python)
    wheels = sorted(cache.glob(f"ray-{version}-{t}-{t}-*.whl"))
    if not wheels:
        print(f"ray_bundle: no ray {version} wheel for {t} in {cache}", file=sys.stderr)
        return 1
    deps_dir = cache / f"deps-{t}"
    deps_dir.mkdir(exist_ok=True)
    download(list(DEPS), python, deps_dir)

    out.mkdir(parents=True, exist_ok=True)
    exclude_from_git(out)
    for old in [*out.glob("*.whl"), out / archive_name(python)]:
        old.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="raybundle-") as tmp:
        stage = Path(tmp)
        with zipfile.ZipFile(wheels[0]) as z:
            for zi in z.infolist():
                target = Path(z.extract(zi, stage))
                mode = zi.external_attr >> 16
                if mode and not zi.is_dir():
                    os.chmod(target, mode & 0o777)  # zipfile drops the mode: raylet, gcs_server
        unpacked = du(stage)
        dropped: dict[str, int] = {}
        for rel in DROP:
            p = stage / rel
            if p.exists():
                dropped[rel] = du(p)
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        kept = du(stage)
        archive = out / archive_name(python)
        with tarfile.open(archive, "w:xz", preset=6) as tar:
            for top in sorted(stage.iterdir()):
                tar.add(top, arcname=top.name)
    for whl in sorted(deps_dir.glob("*.whl")):
        shutil.copy2(whl, out / whl.name)

    print(f"ray {version} for {t}: wheel {mib(wheels[0].stat().st_size)}, unpacked {mib(unpacked)}")
    for rel, n in sorted(dropped.items(), key=lambda kv: -kv[1]):
        print(f"  dropped {rel:28s} {mib(n):>10s}")
    print(f"  dropped in all {mib(unpacked - kept)}, kept {mib(kept)} unpacked")
    total = 0
    for f in sorted(out.iterdir()):
        if f.is_file() and (f.name == archive.name or f.suffix == ".whl"):
            total += f.stat().st_size
            print(f"  {f.name:50s} {mib(f.stat().st_size):>10s}")
    print(f"bundle: {mib(total)} in {out}")
    print(f"install (from the repository root): {install_line(shown, python)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default="3.12", help="the GPU machine's CPython (default 3.12)")
    p.add_argument("--out", default=".raybundle", help="where the bundle goes (default .raybundle)")
    p.add_argument(
        "--cache",
        default=os.path.join(tempfile.gettempdir(), "raybundle-cache"),
        help="where the downloaded wheels are kept between builds",
    )
    p.add_argument(
        "--print-install", action="store_true", help="print the GPU machine's install line"
    )
    args = p.parse_args(argv)
    if args.print_install:
        print(install_line(args.out, args.python))
        return 0
    out = Path(args.out)
    if not out.is_absolute():
        out = REPO / out
    return build(args.python, out, Path(args.cache), args.out)


if __name__ == "__main__":
    sys.exit(main())
