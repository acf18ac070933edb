"""One ``auditor run``: the job, the node agent, the live view, the verdict and the report.

Order matters for cost: the job starts first and Ray starts while the job imports torch, so the
auditor adds little to the job's wall time; the probe buffers its first samples until the agent
listens on the socket path chosen up front.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any, TextIO

from auditor.analysis import SampleStore, analyze
from auditor.analysis.findings import Finding
from auditor.analysis.snapshot import WARMUP_STEPS
from auditor.cluster.fleet import primary_address, remove_sd_file, sd_target, write_sd_file
from auditor.cluster.launcher import (
    Child,
    LaunchError,
    become_subreaper,
    check_command,
    exit_code_of,
    reap_descendants,
)
from auditor.cluster.runtime import AgentHandle, InProcessAgent, check_address, start_agent
from auditor.config import RunConfig
from auditor.report.json_report import build_report, write_report
from auditor.report.terminal import render_live, render_verdict
from auditor.telemetry.recorded import RecordingWriter

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe", "boot")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def probe_env(base: Mapping[str, str], *, sink: str, job: str) -> dict[str, str]:
    """The child's environment: the caller's, plus the probe's boot folder first on PYTHONPATH."""
    env = dict(base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = BOOT_DIR + (os.pathsep + path if path else "")
    env["AUDITOR_PROBE"] = "1"
    env["AUDITOR_SINK"] = sink
    env["AUDITOR_JOB"] = job
    env["AUDITOR_PROBE_ROOT"] = PACKAGE_ROOT
    return env


class _Signals:
    """Forwards SIGINT/SIGTERM/SIGHUP to the child's group; a second SIGINT kills it."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.received: list[int] = []
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old = signal.signal(sig, self._handle)
            self._old.setdefault(sig, old)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        self.forward(sig)

    def forward(self, sig: int) -> None:
        repeated = sig in self.received
        self.received.append(sig)
        self.child.signal_group(signal.SIGKILL if repeated and sig == signal.SIGINT else sig)

    @property
    def interrupted(self) -> bool:
        return bool(self.received)


def run(cfg: RunConfig, *, out: TextIO | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the job under the auditor; returns the job's exit code."""
    out = out or sys.stderr
    check_command(cfg.command)  # raises LaunchError before anything starts
    if not cfg.no_ray:
        check_address(cfg.address)
    job = cfg.job_name
    rundir = tempfile.mkdtemp(prefix="auditor-")
    sink = os.path.join(rundir, "sink.sock")
    become_subreaper()
    child = Child(
        cfg.command, probe_env(env if env is not None else os.environ, sink=sink, job=job)
    )
    signals = _Signals(child)
    signals.install()
    started = time.time()
    notes: list[str] = []
    agent: AgentHandle | None = None
    recorder = (
        RecordingWriter(cfg.record, job=job, meta={"command": list(cfg.command)})
        if cfg.record
        else None
    )
    store = SampleStore(job, on_add=recorder.write if recorder else None, warmup_steps=WARMUP_STEPS)
    findings: list[Finding] = []
    try:
        child.start()
        try:
            agent, note = start_agent(
                use_ray=not cfg.no_ray,
                address=cfg.address,
                device_source=cfg.device_source,
                # The embedded Ray's sessions live in this run's folder and go with it.
                temp_dir=cfg.ray_temp_dir or os.path.join(rundir, "ray"),
                job=job,
                sink_path=sink,
                metrics_host=cfg.metrics_host,
                metrics_port=cfg.metrics_port,
            )
            if note:
                notes.append(note)
                print(f"auditor: {note}", file=out)
            addr = agent.address()
            if addr.get("metrics"):
                print(f"auditor: metrics at {addr['metrics']}", file=out)
        except SystemExit:
            # ray.init replaces the SIGTERM handler with sys.exit: a SIGTERM during its start-up
            # arrives here. Treat it as the signal it was: forward it and carry on to the report.
            signals.forward(signal.SIGTERM)
        except Exception as exc:
            # The job keeps running either way. An agent in this process still takes the
            # ranks' samples (and lets them flush at exit without waiting for one).
            note = f"node agent on Ray failed ({type(exc).__name__}: {exc}); it ran in-process"
            try:
                agent = InProcessAgent(
                    device_source=cfg.device_source,
                    job=job,
                    sink_path=sink,
                    metrics_host=cfg.metrics_host,
                    metrics_port=cfg.metrics_port,
                )
            except Exception as again:
                note = f"no node agent ({exc}; in-process: {again}): the job ran unaudited"
            notes.append(note)
            print(f"auditor: {note}", file=out)
        signals.install()  # again: ray.init installed its own SIGTERM handler over ours
        if cfg.sd_file and agent is not None:
            _list_endpoint(cfg.sd_file, cfg.metrics_host, agent, job, notes, out)
        findings = _live_loop(cfg, child, agent, store, started, out)
        code = child.wait()
        if signals.interrupted and code is None:
            code = child.stop(cfg.grace)
        _final_drain(agent, store)
    except LaunchError:
        raise
    finally:
        if cfg.sd_file:
            # First, so Prometheus stops scraping before the endpoint goes: a listed endpoint
            # that is down raises AuditorExporterDown. Also a file an earlier, killed run left.
            try:
                remove_sd_file(cfg.sd_file)
            except OSError as exc:
                print(f"auditor: could not remove {cfg.sd_file}: {exc}", file=out)
        signals.restore()
        if child.poll() is None and child.proc is not None:
            child.stop(cfg.grace)
    final_code = child.poll()
    exit_code = exit_code_of(final_code if final_code is not None else 1)
    duration = time.time() - started
    now = store.latest_time() or time.time()
    final = analyze(store.snapshot(now, None), cfg.overrides) if store.ranks else findings
    if not store.ranks:
        notes.append(
            "no training step was measured (the job ended early or the probe did not attach)"
        )
    report = build_report(
        command=cfg.command,
        exit_code=exit_code,
        duration_s=duration,
        snapshot=store.snapshot(now, None),
        findings=final,
        job=job,
        notes=notes,
        interrupted=signals.interrupted,
    )
    try:
        if cfg.report:
            write_report(cfg.report, report)
        if cfg.html:
            try:
                from auditor.report.html import write_html_for_run

                write_html_for_run(cfg.html, report, store)
            except Exception as exc:  # the verdict and the JSON report matter more
                print(f"auditor: could not write the HTML report: {exc}", file=out)
    finally:
        if recorder is not None:
            recorder.close()
        if agent is not None:
            _stop_quietly(agent)
        reap_descendants()
        shutil.rmtree(rundir, ignore_errors=True)
    if cfg.json:
        print(json.dumps(report, indent=2), flush=True)
    else:
        print(render_verdict(report), file=out, flush=True)
    return exit_code


def _list_endpoint(
    path: str, metrics_host: str, agent: AgentHandle, job: str, notes: list[str], out: TextIO
) -> None:
    """``--sd-file``: list this run's metrics endpoint for Prometheus' file service discovery,
    with the job and the node as target labels. A wildcard bind is listed under this machine's
    primary address, as ``auditor fleet`` lists a node's IP. A failure is a note: the job runs."""
    addr = agent.address()
    url = addr.get("metrics")
    if not url:
        return
    target = sd_target(str(url), metrics_host, primary_address())
    node = str(addr.get("node") or socket.gethostname())
    entry = {"targets": [target], "labels": {"auditor_job": job, "node": node}}
    try:
        write_sd_file(path, [entry])
    except OSError as exc:
        note = f"could not write the SD file {path}: {exc}"
        notes.append(note)
        print(f"auditor: {note}", file=out)
        return
    print(f"auditor: Prometheus target {target} listed in {path}", file=out)


def _live_loop(
    cfg: RunConfig,
    child: Child,
    agent: AgentHandle | None,
    store: SampleStore,
    started: float,
    out: TextIO,
) -> list[Finding]:
    findings: list[Finding] = []
    interval = cfg.live_interval if cfg.live_interval > 0 else 1.0
    while child.wait(interval) is None:
        if agent is None:
            continue
        try:
            store.add(agent.drain())
        except Exception as exc:
            print(f"auditor: node agent unreachable: {exc}", file=out)
            continue
        if not store.ranks:
            continue
        snap = store.snapshot(time.time(), cfg.window)
        findings = analyze(snap, cfg.overrides)
        if cfg.metrics_port is not None:
            agent.set_findings([f.to_dict() for f in findings])
        if not cfg.quiet and cfg.live_interval > 0:
            print(
                render_live(snap, findings, elapsed_s=time.time() - started), file=out, flush=True
            )
    return findings


def _final_drain(agent: AgentHandle | None, store: SampleStore, timeout_s: float = 3.0) -> None:
    """After the job ended: collect the ranks' last flushes (they close their sockets at exit)."""
    if agent is None:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            store.add(agent.drain())
        except Exception:
            return
        if set(store.ranks) <= store.ended or time.monotonic() >= deadline:
            return
        time.sleep(0.2)


def _stop_quietly(agent: AgentHandle) -> None:
    done = threading.Event()

    def stop() -> None:
        try:
            agent.stop()
        finally:
            done.set()

    t = threading.Thread(target=stop, daemon=True)
    t.start()
    done.wait(15)
