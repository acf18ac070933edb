"""``auditor doctor``: what this machine can measure."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from auditor.configs import DoctorConfig

from .options import Option, add_options, boolean, resolve

DOCTOR_OPTIONS: tuple[Option, ...] = (
    Option("--json", "json", "print the checks as JSON", boolean, False, True),
    Option(
        "--prometheus-url",
        "prometheus_url",
        "also check this Prometheus server (e.g. http://127.0.0.1:9090)",
    ),
)


def doctor_config(
    ns: argparse.Namespace, env: Mapping[str, str], command: Sequence[str] = ()
) -> DoctorConfig:
    return DoctorConfig(**resolve(ns, DOCTOR_OPTIONS, env), command=tuple(command))


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check NVML, Ray, Prometheus and the probe on this machine",
        description="Check what the auditor can measure here and say what is missing; "
        "after --, the command auditor run would start (its launcher is named).",
    )
    add_options(p, DOCTOR_OPTIONS)


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "doctor":
        return None
    from auditor.commands.doctor import doctor

    # A command after ``--``: the launcher ``auditor run -- COMMAND`` would start, named too.
    return doctor(doctor_config(ns, env, command))
