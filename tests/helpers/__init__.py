"""Helpers shared by the tests, each kept once.

* :mod:`.waiting`: ``wait_for``, the one poll-until-true loop (never a fixed sleep).
* :mod:`.jobs`: constructed DDP jobs (per-rank phase timings in, a ``Snapshot`` out).
* :mod:`.gpus`: NVML-shaped GPU samples, attached to a constructed job or written as a recording.
* :mod:`.reports`: the report tests' two-rank stores and the final report a run ends with.
"""
