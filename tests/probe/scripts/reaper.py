"""Subprocess target for the launcher tests: becomes a child subreaper (as ``auditor run`` does),
orphans a sleeper that ignores SIGTERM, then reaps it with ``reap_descendants``.

Prints one JSON line: whether it became a subreaper, the sleeper's PID and parent before the
reap, what ``reap_descendants`` returned and whether the sleeper is gone afterwards. Runs in
its own process because being a subreaper is a property of the process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

from auditor.cluster.launcher import become_subreaper, descendants, reap_descendants

READY = os.path.join(tempfile.mkdtemp(prefix="aud"), "ready")
SLEEPER = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    f"open({READY!r}, 'w').close(); time.sleep(60)"
)
# The middle process starts the sleeper in a session of its own, prints its PID, and exits. The
# sleeper must not hold the middle's stdout pipe, or reading that pipe would wait for it.
MIDDLE = (
    "import subprocess, sys; "
    f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], start_new_session=True, "
    "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(p.pid, flush=True)"
)

subreaper = become_subreaper()
middle = subprocess.run([sys.executable, "-c", MIDDLE], capture_output=True, text=True, check=True)
sleeper = int(middle.stdout.strip())
deadline = time.monotonic() + 10
parent = None
while time.monotonic() < deadline:
    try:
        parent = psutil.Process(sleeper).ppid()
    except psutil.Error:
        break
    if parent == os.getpid() and os.path.exists(READY):
        break
    time.sleep(0.02)
found = [p.pid for p in descendants()]
t0 = time.monotonic()
reaped = reap_descendants(grace_s=0.5)
took = time.monotonic() - t0
print(
    json.dumps(
        {
            "subreaper": subreaper,
            "pid": os.getpid(),
            "sleeper": sleeper,
            "parent": parent,
            "found": found,
            "reaped": reaped,
            "alive_after": psutil.pid_exists(sleeper),
            "left": [p.pid for p in descendants()],
            "took": took,
            "ready": os.path.exists(READY),
        }
    )
)
shutil.rmtree(os.path.dirname(READY), ignore_errors=True)
