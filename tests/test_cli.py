"""CLI errors: one clear line on stderr and exit status 2, before anything starts."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from auditor.cli import build_parser, main
from auditor.cli.dashboards import PUSH_OPTIONS, RENDER_OPTIONS, push_config, render_config
from auditor.cli.doctor import DOCTOR_OPTIONS, doctor_config
from auditor.cli.fleet import FLEET_OPTIONS, fleet_config
from auditor.cli.options import Option, device_source, resolve
from auditor.cli.replay import REPLAY_OPTIONS, replay_config
from auditor.cli.reports import (
    ANALYZE_OPTIONS,
    COMPARE_OPTIONS,
    REPORT_OPTIONS,
    analyze_config,
    compare_config,
    report_config,
)
from auditor.cli.run import RUN_OPTIONS, run_config
from auditor.cli.serve import SERVE_OPTIONS, serve_config
from auditor.configs import ConfigError


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "nothing to run"),
        (["run", "--"], "nothing to run"),
        (["run", "--", "torchrun", "--nproc_per_node=2", "missing_script.py"], "script not found"),
        (["frobnicate"], "invalid choice"),
        ([], "missing command"),
        (["run", "--metrics-port", "99999", "--", "true"], "--metrics-port"),
        (["run", "--window", "-3", "--", "true"], "--window"),
        (["run", "--set", "data_starvation", "--", "true"], "--set"),
        (["run", "--bogus", "--", "true"], "unrecognized arguments"),
        (["run", "--address", "127.0.0.1:1", "--", "true"], "cannot reach the Ray cluster"),
        (["run", "--address", "nohostport", "--", "true"], "--address"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("auditor: error: ") and message in err


def test_environment_twins_are_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUDITOR_METRICS_PORT", "not-a-port")
    assert main(["run", "--", "true"]) == 2
    assert "AUDITOR_METRICS_PORT" in capsys.readouterr().err


# --- every option of every command has an AUDITOR_* twin that its command really reads -----------
# Each command's option table and the function that turns its parsed command line (and the
# environment) into what the command runs with, as the CLI's dispatch does.
Build = Callable[[argparse.Namespace, Mapping[str, str]], Any]
TWINS: dict[tuple[str, ...], tuple[tuple[Option, ...], Build]] = {
    ("run",): (RUN_OPTIONS, lambda ns, env: run_config(ns, ["true"], env)),
    ("fleet",): (FLEET_OPTIONS, fleet_config),
    ("doctor",): (DOCTOR_OPTIONS, doctor_config),
    ("serve",): (SERVE_OPTIONS, serve_config),
    ("replay",): (REPLAY_OPTIONS, replay_config),
    ("dashboards", "render"): (RENDER_OPTIONS, render_config),
    ("dashboards", "push"): (PUSH_OPTIONS, push_config),
    ("analyze",): (ANALYZE_OPTIONS, analyze_config),
    ("report",): (REPORT_OPTIONS, report_config),
    ("compare",): (COMPARE_OPTIONS, compare_config),
}
# What a command needs from the environment besides the option under test.
BASE_ENV: dict[tuple[str, ...], dict[str, str]] = {
    ("fleet",): {"AUDITOR_ADDRESS": "auto"},
    ("report",): {"AUDITOR_HTML": "page.html"},
}


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command the real parser accepts (nested ones such as ``dashboards push`` too)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _commands(child, (*path, name))


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings
        and not isinstance(a, argparse._HelpAction)
        and a.help != argparse.SUPPRESS  # push's --grafana-token: there only to be refused
    ]


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    return [f"positional-{a.dest}" for a in parser._actions if not a.option_strings]


def _value_for(opt: Option, tmp_path: Path) -> str:
    """A valid value for ``opt`` from the environment, different from its default."""
    if opt.is_flag:
        return "1"
    if opt.type is device_source:
        recording = tmp_path / "gpus.jsonl"
        recording.write_text("")
        return f"recorded:{recording}"
    if opt.dest == "set":
        return "data_starvation.min_wait_ratio=0.3"
    if opt.dest == "apply":
        return "rank0.num_workers=2"
    if opt.type is str:
        return f"from-{opt.env.lower()}"
    samples = {
        "port": "4321",
        "niceness": "7",
        "positive": "2.5",
        "non_negative": "2.5",
        "finite_positive": "2.5",
        "url": "http://h:1",
        "severity": "critical",
        "json_destination": "-",
        "gpu_source": "dcgm",
        "serve_gpu_source": "dcgm",
        "dcgm_counters": "default",
    }
    name = getattr(opt.type, "__name__", "")
    assert name in samples, f"{opt.flag}: no sample value for option type {name}"
    return samples[name]


def _read(config: Any, dest: str) -> Any:
    return config[dest] if isinstance(config, Mapping) else getattr(config, dest)


COMMANDS = [
    pytest.param(path, id=" ".join(path))
    for path, parser in _commands(build_parser())
    if _options(parser)
]


def test_every_command_is_covered() -> None:
    found = dict(_commands(build_parser()))
    assert set(found) >= {("run",), ("fleet",), ("serve",), ("replay",), ("dashboards", "push")}
    assert {path for path, parser in found.items() if not _options(parser)} == {("probe-path",)}
    assert set(found) - set(TWINS) == {("probe-path",)}


@pytest.mark.parametrize("path", COMMANDS)
def test_every_option_has_an_environment_twin_that_is_read(
    path: tuple[str, ...], tmp_path: Path
) -> None:
    parser = dict(_commands(build_parser()))[path]
    flags = {a.option_strings[0]: a.dest for a in _options(parser)}
    assert path in TWINS, f"auditor {' '.join(path)}: options {sorted(flags)} have no twins"
    table, build = TWINS[path]
    # The parser's options and the twin table are the same options.
    assert flags == {o.flag: o.dest for o in table}
    assert len({o.env for o in table}) == len(table)
    argv = [*path, *_positionals(parser)]
    for opt in table:
        raw = _value_for(opt, tmp_path)
        env = {**BASE_ENV.get(path, {}), opt.env: raw}
        expected = True if opt.is_flag else opt.type(raw)
        assert expected != opt.default, opt.flag
        # No flag on the command line: the value comes from the twin.
        config = build(build_parser().parse_args(argv), env)
        assert _read(config, opt.dest) == expected, (opt.env, raw)
        if opt.dest == "set":
            assert _read(config, "overrides") == {"data_starvation": {"min_wait_ratio": 0.3}}
        if not opt.is_flag:
            # The command line wins over the environment.
            flagged = build_parser().parse_args([*argv, opt.flag, raw])
            env[opt.env] = "not a valid value"
            assert _read(build(flagged, env), opt.dest) == expected, opt.flag


def test_console_script_runs_a_plain_command(tmp_path: Path) -> None:
    """The installed entry point: exit code comes through, with the in-process agent."""
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "run", "--no-ray", "--quiet", "--report", str(report),
         "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3
    assert report.exists()


def test_probe_path_prints_the_boot_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe-path"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert (path / "sitecustomize.py").is_file()


# --- commands that cannot run exit as a shell would: 127 not found, 126 not executable ----------


def _run_cli(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``auditor run`` as users start it, its temp files in ``tmp_path`` (to see what is left)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "auditor", "run", "--no-ray", "--quiet", "--", *argv],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip


def _executable(path: Path, text: str, mode: int = 0o755) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda d: "no-such-launcher-xyz", 127, "command not found: no-such-launcher-xyz"),
        (lambda d: str(d / "missing.sh"), 127, "command not found"),
        (lambda d: _executable(d / "x.sh", "#!/bin/sh\n", 0o644), 126, "not executable"),
        (lambda d: str(d), 126, "is a directory"),
        # Found and executable, yet the kernel refuses it (no #! line): the start itself fails.
        (lambda d: _executable(d / "noshebang", "echo hi\n"), 126, "cannot start"),
    ],
    ids=["not-on-path", "missing-path", "no-x-bit", "directory", "exec-format"],
)
def test_a_command_that_cannot_run_exits_as_a_shell_would(
    make: Callable[[Path], str], code: int, message: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc = _run_cli([make(work)], tmp_path)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("auditor: error: ") and message in proc.stderr
    assert proc.stdout == ""
    # Nothing left behind: no run folder (it holds the rank socket), no process.
    assert [p.name for p in tmp_path.iterdir()] == ["work"]


def test_set_given_twice_applies_both() -> None:
    ns = build_parser().parse_args(
        ["run", "--set", "data_starvation.min_wait_ratio=0.3", "--set", "batch_split.min_ratio=1.3"]
    )
    cfg = run_config(ns, ["true"], {})
    assert cfg.overrides == {
        "data_starvation": {"min_wait_ratio": 0.3},
        "batch_split": {"min_ratio": 1.3},
    }


@pytest.mark.parametrize("path", COMMANDS)
def test_help_shows_every_default_and_twin(path: tuple[str, ...]) -> None:
    parser = dict(_commands(build_parser()))[path]
    table, _ = TWINS[path]
    helps = {a.option_strings[0]: a.help or "" for a in _options(parser)}
    for opt in table:
        assert helps[opt.flag].endswith(f"; env {opt.env})"), helps[opt.flag]
        assert "(default: " in helps[opt.flag], helps[opt.flag]
        if opt.default is not None and not opt.is_flag:
            assert f"(default: {opt.default}; env {opt.env})" in helps[opt.flag]
    # What the user reads, wrapped by argparse: every twin is named.
    text = parser.format_help()
    assert all(opt.env in text for opt in table)


def test_json_takes_a_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = build_parser().parse_args(["run", "--json", "-"])
    assert run_config(ns, ["true"], {}).json == "-"
    ns = build_parser().parse_args(["run", "--json", "verdict.json"])
    assert run_config(ns, ["true"], {}).json == "verdict.json"
    # AUDITOR_JSON=1, as set for ``auditor analyze --json``, still means stdout, never a file.
    ns = build_parser().parse_args(["run"])
    assert run_config(ns, ["true"], {"AUDITOR_JSON": "1"}).json == "-"
    assert run_config(ns, ["true"], {"AUDITOR_JSON": "0"}).json is None


def test_fail_on_takes_a_severity() -> None:
    ns = build_parser().parse_args(["run", "--fail-on", "Critical"])
    assert run_config(ns, ["true"], {}).fail_on == "critical"
    ns = build_parser().parse_args(["run", "--fail-on", "info"])
    with pytest.raises(ConfigError, match="--fail-on: expected warning or critical"):
        run_config(ns, ["true"], {})
    assert (
        resolve(build_parser().parse_args(["analyze", "r"]), ANALYZE_OPTIONS, {}).get("fail_on")
        is None
    )
