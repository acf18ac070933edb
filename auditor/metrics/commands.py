"""The metrics layer's subcommands: ``auditor replay`` (a recording served as a live endpoint)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

from auditor.config import ConfigError, Option, _bool, _port, _positive, add_options, resolve
from auditor.telemetry.recorded import RecordingError, read_recording

REPLAY_OPTIONS: tuple[Option, ...] = (
    Option(
        "--metrics-host",
        "metrics_host",
        "address the metrics endpoint binds (0.0.0.0: every interface)",
        str,
        "127.0.0.1",
    ),
    Option("--metrics-port", "metrics_port", "port of the endpoint (0: any free)", _port, 9400),
    Option("--speed", "speed", "play this many times faster than recorded", _positive, 1.0),
    Option(
        "--loop",
        "loop",
        "start again at the end; counters keep growing across passes",
        _bool,
        False,
        True,
    ),
    Option("--job", "job", "job label to export (default: the recording's job)"),
    Option("--node", "node", "node of a multi-node recording to export (one per endpoint)"),
    Option(
        "--as-node", "as_node", "export the node under this name (several replays side by side)"
    ),
)


@dataclass(frozen=True)
class ReplayConfig:
    recording: str
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9400
    speed: float = 1.0
    loop: bool = False
    job: str | None = None
    node: str | None = None
    as_node: str | None = None


def replay_config(ns: argparse.Namespace, env: Mapping[str, str]) -> ReplayConfig:
    return ReplayConfig(recording=ns.recording, **resolve(ns, REPLAY_OPTIONS, env))


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Adds this layer's subcommands to the CLI's subparsers."""
    replay = sub.add_parser(
        "replay",
        help="serve a recording as a live node endpoint (demos, dashboards, tests)",
        description="Serve RECORDING's GPU, rank and host metrics in real time as a node agent "
        "would, timestamps shifted to now; runs until SIGINT/SIGTERM.",
    )
    replay.add_argument("recording", metavar="RECORDING", help="an auditor recording (.jsonl)")
    add_options(replay, REPLAY_OPTIONS)


def dispatch(ns: argparse.Namespace) -> int | None:
    """Runs ``ns.cmd`` if this module owns it; None otherwise."""
    if ns.cmd == "replay":
        return run_replay(replay_config(ns, os.environ))
    return None


def run_replay(cfg: ReplayConfig, *, out: TextIO | None = None) -> int:
    """``auditor replay``: play ``cfg.recording`` into a served endpoint until SIGINT/SIGTERM.

    A recording that cannot be read or replayed, or a port that cannot be bound, raises
    :class:`ConfigError` (one line, exit 2).
    """
    from .exporter import make_registry, serve, stop
    from .replay import Replay, ReplayError

    out = out or sys.stderr
    try:
        recording = read_recording(cfg.recording)
        replay = Replay(
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
    try:
        server, port = serve(
            make_registry(lambda: replay.state), host=cfg.metrics_host, port=cfg.metrics_port
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot serve on {cfg.metrics_host}:{cfg.metrics_port}: {exc.strerror or exc}"
        ) from None

    received: list[int] = []
    stop_event = threading.Event()

    def handle(sig: int, frame: FrameType | None) -> None:
        received.append(sig)
        stop_event.set()

    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    player = threading.Thread(target=replay.run, name="auditor-replay", daemon=True)
    try:
        host = f"[{cfg.metrics_host}]" if ":" in cfg.metrics_host else cfg.metrics_host
        print(
            f"auditor: replaying {cfg.recording} (job {replay.job!r}, node {replay.node!r}, "
            f"{replay.duration_s:.1f} s per pass at speed {cfg.speed:g}"
            f"{', looping' if cfg.loop else ''}) on http://{host}:{port}/metrics",
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
        replay.stop()
        player.join(timeout=5)
        stop(server)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print(
        f"auditor: replay stopped after {replay.applied} tick(s)"
        f"{f' ({len(received)} signal(s))' if received else ''}",
        file=out,
        flush=True,
    )
    return 0
