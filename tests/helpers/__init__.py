"""Helpers shared by the tests, each kept once.

* :mod:`.waiting`: ``wait_for``, the one poll-until-true loop (never a fixed sleep), and
  ``wait_quietly`` where the caller's own assert reports a timeout.
* :mod:`.tools`: ``require_tool``, the one decision on a missing promtool, amtool, chromium...
  (skip on a developer's machine, fail under ``CI=true``).
* :mod:`.exits`: ``ended_well``, the one judgement of a training job's exit code (gloo's
  abort at interpreter exit, after the work is done, is not the job's failure).
* :mod:`.units`: ``GIB`` and ``MIB``.
* :mod:`.clocks`: fake host clock and CUDA-event-like device timer, moved by hand.
* :mod:`.jobs`: constructed DDP jobs (per-rank phase timings in, a ``Snapshot`` out).
* :mod:`.gpus`: NVML-shaped GPU samples, attached to a constructed job or written as a recording;
  ``gpu_uuid(node, index)``, the one UUID scheme.
* :mod:`.snapshots`: DataParallel and batch-ramp jobs, and measurements set on a snapshot after
  the fact (data-wait CPU, collective operations, process memory, host load and memory).
* :mod:`.reports`: the report tests' two-rank stores and the final report a run ends with.
* :mod:`.scrape`: a Prometheus endpoint read back as samples by name and labels.
* :mod:`.prometheus`: what Prometheus answers the service's queries with, for a canned job.
"""
