"""A job that talks while it trains: runs the command it is given (torchrun ...) and meanwhile
prints numbered lines, alternately on stdout and stderr, so a test can check that every line of
the job's own output arrives once and in order. Exits with the command's exit code.

    python tests/e2e/chatty_job.py torchrun --nproc_per_node=2 examples/starved_rank.py
"""

import subprocess
import sys
import time

print(f"chatty: stdout tty {sys.stdout.isatty()}, stderr tty {sys.stderr.isatty()}", flush=True)
proc = subprocess.Popen(sys.argv[1:])
i = 0
while proc.poll() is None:
    print(f"job line {i:03d}", file=sys.stdout if i % 2 == 0 else sys.stderr, flush=True)
    i += 1
    time.sleep(0.25)
print(f"job line {i:03d} (the last)", flush=True)
sys.exit(proc.returncode)
