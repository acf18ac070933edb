"""``auditor run``: the job, the node agent, the live view, the verdict and the report.

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

from auditor.audit import Audit
from auditor.cluster.address import AddressError, RayCluster, resolve_cluster
from auditor.cluster.fleet import (
    primary_address,
    remove_sd_file,
    sd_entry,
    sd_target,
    write_sd_file,
)
from auditor.cluster.jobview import JobViewClient, NodeClashError, job_key, label_batch, member_name
from auditor.cluster.launcher import (
    Child,
    LaunchError,
    become_subreaper,
    check_command,
    exit_code_of,
    reap_descendants,
)
from auditor.cluster.probing import ProbeErrors, probe_env
from auditor.cluster.runtime import AgentHandle, InProcessAgent, check_cluster, start_agent
from auditor.configs import LIVE_INTERVAL_S, RunConfig
from auditor.launch_env import Launch, identify, read_pod_labels, remote_ranks_note
from auditor.liveview import LiveView, open_view
from auditor.metrics.endpoint import RunEndpoint
from auditor.report.applied import applied_line, plan_lines, with_plan
from auditor.report.events import EventStream
from auditor.report.exit_status import exit_status
from auditor.report.json_report import write_report
from auditor.report.model import Report
from auditor.report.terminal import render_verdict
from auditor.telemetry.recorded import RecordingWriter
from auditor.torchrun import node_rank


class _Signals:
    """Forwards SIGINT/SIGTERM/SIGHUP to the child's group; a second SIGINT kills it."""

    def __init__(self, child: Child, out: TextIO) -> None:
        self.child = child
        self.out = out
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
        if sig == signal.SIGINT and sig not in self.received:
            # A job stuck in a collective or a fork may not stop on its own: say how to end it.
            print("auditor: SIGINT sent to the job; Ctrl-C again kills it", file=self.out)
        self.forward(sig)

    def forward(self, sig: int) -> None:
        repeated = sig in self.received
        self.received.append(sig)
        self.child.signal_group(signal.SIGKILL if repeated and sig == signal.SIGINT else sig)

    @property
    def interrupted(self) -> bool:
        return bool(self.received)


def _device_source(cfg: RunConfig) -> str:
    """The agent's device source: none where dcgm-exporter reads the GPUs (no monitors)."""
    from auditor.cluster.monitor import NO_DEVICES

    return NO_DEVICES if cfg.gpu_source == "dcgm" else cfg.device_source


def run(cfg: RunConfig, *, out: TextIO | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the job under the auditor; returns the job's exit code (or 3, ``--fail-on``)."""
    out = out or sys.stderr
    check_command(cfg.command)  # raises LaunchError before anything starts
    json_fd = _stdout_for_json() if cfg.json == "-" else None
    try:
        return _run(cfg, out, env, json_fd)
    finally:
        if json_fd is not None:
            _restore_stdout(json_fd)


def _stdout_for_json() -> int:
    """``--json -``: keep this process's stdout for the verdict JSON alone. Its descriptor is
    set aside and fd 1 becomes stderr, so the job (which inherits fd 1), Ray and anything else
    that prints go to stderr. Returns the set-aside descriptor."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    return saved


def _restore_stdout(saved: int) -> None:
    sys.stdout.flush()
    os.dup2(saved, 1)
    os.close(saved)


def _write_json(dest: str, text: str, json_fd: int | None, out: TextIO) -> None:
    """The verdict JSON to ``--json``'s file, or to the stdout :func:`_stdout_for_json` kept."""
    if json_fd is None:
        try:
            with open(dest, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            print(f"auditor: could not write the JSON verdict to {dest}: {exc}", file=out)
        return
    data = (text + "\n").encode()
    try:
        while data:
            data = data[os.write(json_fd, data) :]
    except BrokenPipeError:
        pass  # the reader went away (``| head``): nothing more to say


def _run(cfg: RunConfig, out: TextIO, env: Mapping[str, str] | None, json_fd: int | None) -> int:
    base_env = env if env is not None else os.environ
    # Where it was launched (auditor.launch_env): a SLURM job's id or a training operator's
    # job name names the job (``--job`` wins); one auditor per SLURM task or per pod is one of
    # several runs of one job, which meet in the job view like the nodes of a torchrun job.
    launch = identify(cfg.command, base_env, read_pod_labels(base_env))
    job = cfg.job or launch.job_label or cfg.job_name
    # The Ray this run joins (None: an embedded one), decided as ``doctor`` decides it; a
    # named cluster that does not answer is refused here, before the job starts.
    cluster = None if cfg.no_ray else _cluster_to_join(cfg.address, base_env)
    key = (job_key(cfg.job, cfg.command, base_env) or launch.key) if cluster is not None else None
    # The node's name, where its hostname does not tell nodes apart (two Ray nodes on one
    # machine, or clones with one hostname): the Ray node (auditor_node:<name> resource or Ray
    # node name) the agent runs on, and the label of this node's ranks (SLURM's node name for
    # a task's run in the job view).
    node_label = base_env.get("AUDITOR_NODE") or (launch.node if key and launch.member else None)
    # Runs of one job tell their nodes apart by torchrun's node rank too (two torchrun agents
    # of one job on one host share the hostname), or the launcher's task (two SLURM tasks, or
    # two pods, on one host), unless the user named the node.
    group: int | str | None = None
    if key is not None and not base_env.get("AUDITOR_NODE"):
        group = launch.member or node_rank(cfg.command, base_env)
    # The run's endpoint is bound first: a port that is taken is refused before the job starts.
    endpoint = _open_endpoint(cfg, job, node_label)
    # So is an events file that cannot be written.
    events = _open_events(cfg, job, endpoint)
    rundir = tempfile.mkdtemp(prefix="auditor-")
    sink = os.path.join(rundir, "sink.sock")
    probe_errors = ProbeErrors(os.path.join(rundir, "probe-errors.jsonl"))
    become_subreaper()
    # On a terminal the live panel stays under the job's output, relayed through a pty.
    view = open_view(
        out,
        command=cfg.command,
        job=job,
        window_s=cfg.window,
        quiet=cfg.quiet,
        interval_s=cfg.live_interval,
        started=time.time(),
    )
    out = view.out
    for line in plan_lines(cfg.apply_plan) if cfg.apply_plan is not None else ():
        print(f"auditor: {line}", file=out)
    child = Child(
        cfg.command,
        probe_env(base_env, sink=sink, job=job, errors=probe_errors.path, apply=cfg.apply_plan),
        output=view.child_fd,
    )
    signals = _Signals(child, out)
    signals.install()
    started = time.time()
    notes: list[str] = []
    if launch.per_task and key is None:
        notes.append(alone_note(launch))
        print(f"auditor: {notes[-1]}", file=out)
    if remote_ranks_note(launch):
        notes.append(str(remote_ranks_note(launch)))
        print(f"auditor: {notes[-1]}", file=out)
    agent: AgentHandle | None = None
    recorder = (
        RecordingWriter(cfg.record, job=job, meta={"command": list(cfg.command)})
        if cfg.record
        else None
    )
    audit = Audit(
        job,
        window_s=cfg.window,
        overrides=cfg.overrides,
        on_add=recorder.write if recorder else None,
    )
    link = _Link(audit, notes, out)
    link.probe_errors = probe_errors
    link.events = events
    if events is not None:
        events.start(cfg.command)
    try:
        child.start()
        view.child_started()
        _yield_to_the_job(cfg.nice, notes)
        view.stage(
            "starting the node agent"
            if cfg.no_ray
            else (f"joining Ray at {cluster.address}" if cluster else "starting Ray")
        )
        try:
            agent, note = start_agent(
                use_ray=not cfg.no_ray,
                address=cluster.init_address if cluster else None,
                device_source=_device_source(cfg),
                # The embedded Ray's sessions live in this run's folder and go with it.
                temp_dir=cfg.ray_temp_dir or os.path.join(rundir, "ray"),
                job=job,
                sink_path=sink,
                host=node_label,
            )
            if note:
                notes.append(note)
                print(f"auditor: {note}", file=out)
            if cluster is not None:
                print(
                    f"auditor: node agent on the Ray cluster at {cluster.address} "
                    f"(from {cluster.source})",
                    file=out,
                )
        except SystemExit:
            # ray.init replaces the SIGTERM handler with sys.exit: a SIGTERM during its start-up
            # arrives here. Treat it as the signal it was: forward it and carry on to the report.
            signals.forward(signal.SIGTERM)
        except Exception as exc:
            if cluster is not None:
                # A cluster was named: an agent in this process would audit a job its user
                # believes is on that cluster. The job (only just started) is stopped on the way
                # out, and the run exits 1.
                raise LaunchError(
                    f"could not join the Ray cluster at {cluster.address} (from "
                    f"{cluster.source}): {type(exc).__name__}: {exc}; the job was stopped",
                    JOIN_FAILED_EXIT,
                ) from None
            # The embedded Ray could not start: the job keeps running. An agent in this process
            # still takes the ranks' samples (and lets them flush at exit without waiting).
            note = f"node agent on Ray failed ({type(exc).__name__}: {exc}); it ran in-process"
            try:
                agent = InProcessAgent(
                    device_source=_device_source(cfg),
                    job=job,
                    sink_path=sink,
                    host=node_label,
                )
            except Exception as again:
                note = f"no node agent ({exc}; in-process: {again}): the job ran unaudited"
            notes.append(note)
            print(f"auditor: {note}", file=out)
        signals.install()  # again: ray.init installed its own SIGTERM handler over ours
        view.stage(None)
        if endpoint is not None:
            if agent is not None:
                endpoint.set_node(str(agent.address().get("node") or endpoint.state.node))
            link.endpoint = endpoint
            print(f"auditor: metrics at {endpoint.url}", file=out)
            if cfg.sd_file:
                _list_endpoint(cfg.sd_file, cfg.metrics_host, endpoint, notes, out)
        if agent is not None:
            link.start(agent, key, node_label, group)
        _live_loop(cfg, child, link, out, view)
        code = child.wait()
        if signals.interrupted and code is None:
            code = child.stop(cfg.grace)
        _final_drain(link)
    except LaunchError:
        # The command could not start: nothing ran, nothing is left behind.
        if recorder is not None:
            recorder.close()
        if endpoint is not None:
            endpoint.close()
        if events is not None:
            events.close()
        shutil.rmtree(rundir, ignore_errors=True)
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
        view.close()  # the job's last output relayed, the panel cleared: the verdict follows
    final_code = child.poll()
    exit_code = exit_code_of(final_code if final_code is not None else 1)
    link.finish(exit_code)
    if final_code is not None and child.proc is not None:
        audit.set_exit_status(child.pid, exit_code)  # the rank was the command itself
    duration = time.time() - started
    link.say_probe_errors()
    notes.extend(probe_errors.notes())
    if not audit.store.ranks:
        notes.append(
            "no training step was measured (the job ended early or the probe did not attach)"
        )
    report = audit.report(
        command=cfg.command,
        exit_code=exit_code,
        duration_s=duration,
        notes=notes,
        interrupted=signals.interrupted,
    )
    report = with_plan(report, cfg.apply_plan)  # --apply: the plan, and what no loader took
    try:
        if cfg.report:
            write_report(cfg.report, report)
        if cfg.html:
            try:
                from auditor.report.html import write_html_for_run

                write_html_for_run(cfg.html, report, audit.store)
            except Exception as exc:  # the verdict and the JSON report matter more
                print(f"auditor: could not write the HTML report: {exc}", file=out)
    finally:
        if recorder is not None:
            recorder.close()
        if events is not None:
            _close_events(events, report, out)
        if agent is not None:
            _stop_quietly(agent)
        if endpoint is not None:
            endpoint.close()
        reap_descendants()
        shutil.rmtree(rundir, ignore_errors=True)
    print(render_verdict(report), file=out, flush=True)
    if cfg.json:
        _write_json(cfg.json, json.dumps(report.to_dict(), indent=2), json_fd, out)
    # A job that failed keeps its own code; a job that succeeded fails on its verdict.
    return exit_status(exit_code, report, cfg.fail_on)


def alone_note(launch: Launch) -> str:
    """One of several runs of a job (a SLURM task's, a pod's) with no job view to meet in."""
    what = f"SLURM job {launch.job_id}" if launch.within == "srun" else (launch.job_name or "")
    return (
        f"rank {launch.rank} of {launch.world_size} of {what or 'a job'} ({launch.within}) with "
        "no Ray cluster to meet the others in (--address or RAY_ADDRESS): this run judges its "
        "own ranks only"
    )


# ``auditor run``'s exit status when the cluster it was told to join could not be joined.
JOIN_FAILED_EXIT = 1


def _cluster_to_join(flag: str | None, env: Mapping[str, str]) -> RayCluster | None:
    """The cluster named by ``--address``, ``RAY_ADDRESS`` or ``ray start``'s record, checked to
    answer; None for an embedded Ray. Raises :class:`LaunchError` before anything starts."""
    try:
        cluster = resolve_cluster(flag, env)
    except AddressError as exc:
        raise LaunchError(str(exc)) from None
    if cluster is not None:
        check_cluster(cluster)
    return cluster


def _yield_to_the_job(niceness: int, notes: list[str]) -> None:
    """Lower this process's priority once the job has started at the one it was given: Ray's
    start-up (several processes importing heavy modules) and the live loop then take only the
    cores the job leaves idle. Every process the auditor starts from here on inherits it."""
    if niceness <= 0:
        return
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < niceness:
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError as exc:
        notes.append(f"could not lower the auditor's priority ({exc.strerror or exc})")


def _open_endpoint(cfg: RunConfig, job: str, node: str | None) -> RunEndpoint | None:
    """``--metrics-port``: the run's endpoint, bound now; a port that is taken is a one-line
    error before the job starts."""
    if cfg.metrics_port is None:
        return None
    try:
        return RunEndpoint(
            job, node or socket.gethostname(), host=cfg.metrics_host, port=cfg.metrics_port
        )
    except OSError as exc:
        raise LaunchError(
            f"cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port}: {exc.strerror or exc}"
        ) from None


def _open_events(cfg: RunConfig, job: str, endpoint: RunEndpoint | None) -> EventStream | None:
    """``--events``: the stream's file, opened now; one that cannot be written is a one-line
    error before the job starts (the endpoint bound a moment ago is let go)."""
    if not cfg.events:
        return None
    try:
        return EventStream.open(cfg.events, job)
    except OSError as exc:
        if endpoint is not None:
            endpoint.close()
        raise LaunchError(
            f"cannot write the events file {cfg.events}: {exc.strerror or exc}"
        ) from None


def _close_events(events: EventStream, report: Report, out: TextIO) -> None:
    """The final verdict as the stream's last line; a write that failed mid-run is said once."""
    events.final(report)
    events.close()
    if events.error is not None:
        print(
            f"auditor: the events stream stopped after {events.lines} line(s): "
            f"{events.error.strerror or events.error}",
            file=out,
        )


def _list_endpoint(
    path: str, metrics_host: str, endpoint: RunEndpoint, notes: list[str], out: TextIO
) -> None:
    """``--sd-file``: list this run's metrics endpoint for Prometheus' file service discovery.
    A wildcard bind is listed under this machine's primary address, as ``auditor fleet`` lists a
    node's IP. A failure is a note: the job runs.

    The entry has no target labels (:func:`~auditor.cluster.fleet.sd_entry`): the series carry
    ``auditor_job`` and ``node`` themselves, and a target label of either name would, under a
    default scrape (honor_labels false), rename theirs to ``exported_*`` (or overwrite an
    unowned GPU's empty ``auditor_job`` with this run's)."""
    target = sd_target(endpoint.url, metrics_host, primary_address())
    entry = sd_entry(target)
    try:
        write_sd_file(path, [entry])
    except OSError as exc:
        note = f"could not write the SD file {path}: {exc}"
        notes.append(note)
        print(f"auditor: {note}", file=out)
        return
    print(f"auditor: Prometheus target {target} listed in {path}", file=out)


class _Link:
    """Where this run's batches come from and go: this node's agent, and for a job that spans
    nodes the job view (every other node's batches in, this node's out)."""

    def __init__(self, audit: Audit, notes: list[str], out: TextIO) -> None:
        self.audit = audit
        self.notes = notes
        self.out = out
        self.agent: AgentHandle | None = None
        self.endpoint: RunEndpoint | None = None
        self.view: JobViewClient | None = None
        self.node: str | None = None
        self.judged = 0.0  # monotonic time of the last verdict
        self._view_failed = False
        self.probe_errors: ProbeErrors | None = None
        self.applied_said: dict[int, tuple[tuple[str, Any, Any], ...]] = {}  # --apply
        self.events: EventStream | None = None  # --events

    def say_applied(self) -> None:
        """``--apply``: each rank's moved levers, as soon as its probe says it moved them."""
        for rank, info in sorted(self.audit.store.infos.items()):
            said = self.applied_said.get(rank)
            if info.applied and info.applied != said:
                self.applied_said[rank] = info.applied
                moves = [{"lever": k, "from": a, "to": b} for k, a, b in info.applied]
                print(f"auditor: {applied_line(rank, moves)}", file=self.out)

    def say_probe_errors(self) -> None:
        """Each process whose probe did not attach, as soon as it says so (one line each)."""
        if self.probe_errors is not None:
            for line in self.probe_errors.poll():
                print(f"auditor: {line}", file=self.out)

    def start(
        self,
        agent: AgentHandle,
        key: str | None,
        node: str | None,
        group: int | str | None = None,
    ) -> None:
        """``group``: torchrun's node rank of this run (or its launcher's task, ``task1``),
        part of its name in the job view."""
        self.agent = agent
        ray_node_id = getattr(agent, "ray_node_id", None)
        if key is None or ray_node_id is None:
            return  # one node (or no Ray): nothing to join
        self.node = member_name(
            str(agent.address().get("node") or node or socket.gethostname()), group
        )
        try:
            self.view = JobViewClient(key, self.node, ray_node_id=str(ray_node_id))
            print(f"auditor: node {self.node} joins the job view {self.view.name}", file=self.out)
        except Exception as exc:
            self._note_view(exc)

    def _note_view(self, exc: BaseException) -> None:
        self.view = None
        if not self._view_failed:
            self._view_failed = True
            note = (
                f"{exc}: this node judged alone"
                if isinstance(exc, NodeClashError)
                else f"job view unreachable ({type(exc).__name__}: {exc}): this node judged alone"
            )
            self.notes.append(note)
            print(f"auditor: {note}", file=self.out)

    def step(self) -> None:
        """One exchange: this node's new batch in (and out to the view), the others' in.
        Raises when the agent cannot be reached."""
        if self.agent is None:
            return
        batch = self.agent.drain()
        if self.node is not None:
            batch = label_batch(batch, self.node)
        self.audit.add(batch)
        if self.endpoint is not None:
            self.endpoint.add(batch)
        if self.view is not None:
            try:
                self.view.push(batch)
                self.audit.add_all(self.view.pull())
                self.audit.nodes = self.view.nodes
            except Exception as exc:
                self._note_view(exc)

    def finish(self, exit_code: int) -> None:
        if self.view is None:
            return
        try:
            self.audit.add_all(self.view.finish(exit_code, wait_s=FINAL_WAIT_S))
            self.audit.nodes = self.view.nodes
        except Exception as exc:
            self._note_view(exc)


# At the end of the job: how long a node waits for the other nodes' last samples.
FINAL_WAIT_S = 5.0
# A job across nodes: seconds between exchanges with the job view (this node's agent drained
# and pushed, the others' batches pulled); the verdict is still judged every live interval.
EXCHANGE_S = 0.25


def _live_loop(
    cfg: RunConfig,
    child: Child,
    link: _Link,
    out: TextIO,
    view: LiveView,
) -> None:
    interval = cfg.live_interval if cfg.live_interval > 0 else LIVE_INTERVAL_S
    audit = link.audit
    while child.wait(interval if link.view is None else min(interval, EXCHANGE_S)) is None:
        link.say_probe_errors()
        if link.agent is None:
            continue
        try:
            link.step()
        except Exception as exc:
            print(f"auditor: node agent unreachable: {exc}", file=out)
            continue
        link.say_applied()
        if link.view is not None:
            # Several exchanges per verdict: another node's samples reach this one within a
            # fraction of a second of its own drain, not up to a whole interval later.
            if time.monotonic() - link.judged < interval - EXCHANGE_S / 2:
                continue
            link.judged = time.monotonic()
        if not audit.store.ranks:
            view.update(None, ())  # still waiting for the first rank
            continue
        snap, verdict = audit.judge_live(time.time())
        findings = verdict.findings
        if link.endpoint is not None:
            link.endpoint.set_findings(findings)
            link.endpoint.set_work(snap)
            try:
                link.endpoint.set_gpus(link.agent.gpus())
            except Exception:
                pass  # the agent answered the drain a moment ago; its GPUs can wait a second
        if link.events is not None:
            link.events.verdict(findings, window=verdict.window, ranks=verdict.ranks)
        view.update(snap, findings)


def _final_drain(link: _Link, timeout_s: float = 3.0) -> None:
    """After the job ended: collect the ranks' last flushes (they close their sockets at exit)."""
    if link.agent is None:
        return
    store = link.audit.store
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            link.step()
        except Exception:
            return
        # This node's ranks: the other nodes' ranks are theirs to wait for.
        local = {r for r, i in store.infos.items() if link.node is None or i.host == link.node}
        if local <= store.ended or time.monotonic() >= deadline:
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
