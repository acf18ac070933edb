#!/usr/bin/env bash
# The whole test suite from nothing: system packages, Python packages, lint, types, tests.
# Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# promtool (Debian's prometheus package) checks the exported metrics and the deploy/ configs,
# amtool (prometheus-alertmanager) the Alertmanager config; headless chromium opens the HTML
# report; slurm-wlm and munge are the real SLURM of tests/e2e/test_slurm.py (tests/slurm.py
# starts its daemons on 127.0.0.1 and stops them). No service is started here.
if ! command -v promtool >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1 \
  || ! command -v chromium >/dev/null 2>&1 || ! command -v slurmctld >/dev/null 2>&1 \
  || ! command -v munged >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus prometheus-alertmanager chromium slurm-wlm munge >/dev/null
  else
    echo "tests/run.sh: promtool/amtool/chromium/slurm missing and cannot apt-get install" \
      "(not root)" >&2
  fi
fi

# torch first and pinned: the local CPU build, never the CUDA wheels an unpinned torch pulls.
python3 -m pip install -q torch==2.13.0 numpy
# The framework packages the e2e tests drive (Lightning, transformers, accelerate, Ray Train),
# with torch held at that build: none of them may swap it for another torch.
pins="$(mktemp)"
echo "torch==2.13.0" >"$pins"
python3 -m pip install -q -c "$pins" -e ".[dev,frameworks]"
rm -f "$pins"

# Tests run their own private local Ray; Ray 2.60's token auth is for shared clusters.
export RAY_AUTH_MODE=disabled

ruff check auditor tests examples bench
ruff format --check auditor tests
mypy
python3 -m pytest "$@"
