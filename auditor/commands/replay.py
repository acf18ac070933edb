"""``auditor replay``: a recording served as a live endpoint (:mod:`auditor.metrics.replay`).

The CLI (:mod:`auditor.cli.replay`) builds the :class:`ReplayConfig` and calls :func:`replay`.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from types import FrameType
from typing import TextIO

from auditor.configs import ConfigError, ReplayConfig
from auditor.metrics.state import ExportState
from auditor.telemetry.recorded import RecordingError, read_recording


def replay(cfg: ReplayConfig, *, out: TextIO | None = None) -> int:
    """``auditor replay``: play ``cfg.recording`` into a served endpoint until SIGINT/SIGTERM.

    A recording that cannot be read or replayed, or a port that cannot be bound, raises
    :class:`ConfigError` (one line, exit 2).
    """
    from auditor.metrics.exporter import make_registry, serve, stop
    from auditor.metrics.replay import Replay, ReplayError

    out = out or sys.stderr
    try:
        recording = read_recording(cfg.recording)
        replayer = Replay(
            recording,
            job=cfg.job,
            node=cfg.node,
            as_node=cfg.as_node,
            speed=cfg.speed,
            loop=cfg.loop,
        )
    except RecordingError as exc:
        raise ConfigError(str(exc)) from None  # it names the file already
    except ReplayError as exc:
        raise ConfigError(f"{cfg.recording}: {exc}") from None
    if recording.problems:
        print(
            f"auditor: warning: {len(recording.problems)} unreadable line(s) skipped, first: "
            f"{recording.problems[0]}",
            file=out,
            flush=True,
        )
    dcgm = cfg.gpu_source == "dcgm"

    def state() -> ExportState:
        # With dcgm-exporter as the GPU source the node endpoint exports no GPU of its own (the
        # ranks' GPU owner series stay: they are the join).
        now = replayer.state
        return dataclasses.replace(now, gpus={}) if dcgm else now

    try:
        server, port = serve(make_registry(state), host=cfg.metrics_host, port=cfg.metrics_port)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve on {cfg.metrics_host}:{cfg.metrics_port}: {exc.strerror or exc}"
        ) from None
    dcgm_server = None
    if dcgm:
        from auditor.metrics.dcgm import COUNTER_SETS, DcgmExposition, DcgmServer

        exposition = DcgmExposition(
            lambda: [g.sample for g in replayer.state.gpus.values() if g.sample is not None],
            hostname=cfg.dcgm_hostname or replayer.node,
            fields=COUNTER_SETS[cfg.dcgm_counters],
        )
        try:
            dcgm_server = DcgmServer(exposition, host=cfg.metrics_host, port=cfg.dcgm_port)
        except OSError as exc:
            stop(server)
            raise ConfigError(
                f"cannot serve on {cfg.metrics_host}:{cfg.dcgm_port}: {exc.strerror or exc}"
            ) from None

    received: list[int] = []
    stop_event = threading.Event()

    def handle(sig: int, frame: FrameType | None) -> None:
        received.append(sig)
        stop_event.set()

    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    player = threading.Thread(target=replayer.run, name="auditor-replay", daemon=True)
    try:
        host = f"[{cfg.metrics_host}]" if ":" in cfg.metrics_host else cfg.metrics_host
        print(
            f"auditor: replaying {cfg.recording} (job {replayer.job!r}, node {replayer.node!r}, "
            f"{replayer.duration_s:.1f} s per pass at speed {cfg.speed:g}"
            f"{', looping' if cfg.loop else ''}) on http://{host}:{port}/metrics",
            file=out,
            flush=True,
        )
        if dcgm_server is not None:
            print(
                f"auditor: its GPUs as dcgm-exporter serves them ({cfg.dcgm_counters} counters, "
                f"Hostname {exposition.hostname!r}) on http://{host}:{dcgm_server.port}/metrics",
                file=out,
                flush=True,
            )
        player.start()
        announced = False
        while not stop_event.wait(0.5):
            if not announced and not player.is_alive():
                announced = True
                print(
                    "auditor: recording played to its end; its last state stays served until "
                    "stopped (--loop plays it again)",
                    file=out,
                    flush=True,
                )
    finally:
        replayer.stop()
        player.join(timeout=5)
        stop(server)
        if dcgm_server is not None:
            dcgm_server.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print(
        f"auditor: replay stopped after {replayer.applied} tick(s)"
        f"{f' ({len(received)} signal(s))' if received else ''}",
        file=out,
        flush=True,
    )
    return 0
