"""The generated files: deterministic text, provisioning that matches the dashboards, stale-file
detection, and ``auditor dashboards render [--check]``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from auditor.cli import main
from auditor.ops import render as r
from auditor.ops.boards import DASHBOARDS, DATASOURCE_UID

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_FILES = {f"dashboards/{uid}.json" for uid in DASHBOARDS}
PROVISIONING = {r.DATASOURCE_PROVISIONING, r.DASHBOARD_PROVISIONING}


def test_artifacts_are_the_dashboards_provisioning_and_rules() -> None:
    files = r.artifacts()
    has_alerts = importlib.util.find_spec("auditor.ops.alerts") is not None
    expected = DASHBOARD_FILES | PROVISIONING | ({r.RULES_PATH} if has_alerts else set())
    expected |= {r.DCGM_COUNTERS_PATH}
    assert set(files) == expected
    for rel in DASHBOARD_FILES:
        board = json.loads(files[rel])
        assert rel == f"dashboards/{board['uid']}.json"
    if has_alerts:
        from auditor.ops.alerts import render_rules

        assert files[r.RULES_PATH] == render_rules()
        assert yaml.safe_load(files[r.RULES_PATH])["groups"]


def test_rules_are_left_out_while_the_alerts_module_is_missing() -> None:
    assert r._rules_text("auditor.ops.no_such_module_yet") is None


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    assert r.artifacts() == r.artifacts()
    a, b = tmp_path / "a", tmp_path / "b"
    assert sorted(r.render(a)) == sorted(r.artifacts())
    r.render(b)
    for rel in r.artifacts():
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    # Nothing to do the second time: no rewrite, no new mtime for Grafana to reload.
    assert r.render(a) == []


def test_stale_detects_missing_and_edited_files(tmp_path: Path) -> None:
    assert set(r.stale(tmp_path)) == set(r.artifacts())
    r.render(tmp_path)
    assert r.stale(tmp_path) == []
    cluster = tmp_path / "dashboards/auditor-cluster.json"
    cluster.write_text(cluster.read_text().replace("GPU busy by node", "GPU busy"))
    (tmp_path / r.DASHBOARD_PROVISIONING).unlink()
    assert r.stale(tmp_path) == ["dashboards/auditor-cluster.json", r.DASHBOARD_PROVISIONING]
    assert sorted(r.render(tmp_path)) == sorted(
        ["dashboards/auditor-cluster.json", r.DASHBOARD_PROVISIONING]
    )
    assert r.stale(tmp_path) == []


def test_provisioning_matches_the_dashboards() -> None:
    files = r.artifacts()
    datasources = yaml.safe_load(files[r.DATASOURCE_PROVISIONING])
    assert datasources["apiVersion"] == 1
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == DATASOURCE_UID
    assert ds["url"].startswith("http")
    assert ds["jsonData"]["timeInterval"] == r.SCRAPE_INTERVAL
    for rel in DASHBOARD_FILES:
        variables = json.loads(files[rel])["templating"]["list"]
        (var,) = [v for v in variables if v["type"] == "datasource"]
        assert var["current"]["value"] == DATASOURCE_UID

    providers = yaml.safe_load(files[r.DASHBOARD_PROVISIONING])
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["folder"] == r.FOLDER
    assert provider["options"]["path"] == r.GRAFANA_DASHBOARD_PATH


def test_provisioning_paths_match_the_compose_stack() -> None:
    """deploy/compose mounts dashboards/ where the provider looks and names Prometheus as the
    data source URL does."""
    compose_file = REPO / "deploy/compose/docker-compose.yml"
    assert compose_file.is_file(), f"{compose_file} is part of the repository"
    compose = yaml.safe_load(compose_file.read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    targets = {m.split(":")[1] for m in mounts if m.split(":")[0] == "../../dashboards"}
    assert targets == {r.GRAFANA_DASHBOARD_PATH}
    assert "prometheus" in compose["services"]
    assert r.PROMETHEUS_URL == "http://prometheus:9090"


def test_render_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "render", "--root", str(tmp_path), "--check"]) == 1
    listed = capsys.readouterr().out.split()
    assert set(listed) == set(r.artifacts())
    assert main(["dashboards", "render", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("wrote ") == len(r.artifacts())
    assert main(["dashboards", "render", "--root", str(tmp_path), "--check"]) == 0
    assert capsys.readouterr().out == ""


def test_render_options_have_environment_twins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUDITOR_DASHBOARDS_ROOT", str(tmp_path))
    monkeypatch.setenv("AUDITOR_DASHBOARDS_CHECK", "1")
    assert main(["dashboards", "render"]) == 1
    assert not list(tmp_path.iterdir())  # --check writes nothing
    monkeypatch.setenv("AUDITOR_DASHBOARDS_CHECK", "0")
    assert main(["dashboards", "render"]) == 0
    assert r.stale(tmp_path) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dashboards"], "render or push"),
        (["dashboards", "render", "--root", "/nonexistent/auditor"], "--root"),
        (["dashboards", "frob"], "invalid choice"),
    ],
)
def test_render_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("auditor: error: ") and message in err


def test_the_committed_files_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    """CI's check: the files in the repository are what the code renders."""
    code = main(["dashboards", "render", "--root", str(REPO), "--check"])
    assert code == 0, "stale: " + capsys.readouterr().out + " (run: auditor dashboards render)"


# --- settings of the generated provisioning -----------------------------------------------------


def test_the_data_source_url_and_the_scrape_jobs_are_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pointing the provisioned data source at another Prometheus, and the rules at other scrape
    job names, is an option of the render, not an edit of the code; --check compares with the
    render of the same settings, so the defaults are what the repository commits."""
    settings = [
        "--datasource-url",
        "https://prometheus.monitoring.svc:9090/prom",
        "--nodes-scrape-job",
        "monitoring/auditor-nodes",
        "--serve-scrape-job",
        "auditor_serve",
    ]
    root = ["dashboards", "render", "--root", str(tmp_path)]
    assert main([*root, *settings]) == 0
    capsys.readouterr()
    (ds,) = yaml.safe_load((tmp_path / r.DATASOURCE_PROVISIONING).read_text())["datasources"]
    assert ds["url"] == "https://prometheus.monitoring.svc:9090/prom"
    assert ds["uid"] == DATASOURCE_UID
    rules = yaml.safe_load((tmp_path / r.RULES_PATH).read_text())
    (down,) = [
        rule
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "AuditorExporterDown"
    ]
    assert 'up{job=~"monitoring/auditor-nodes|auditor_serve"} == 0' in down["expr"]
    # The same settings: up to date; the defaults: the two files that hold settings differ.
    assert main([*root, *settings, "--check"]) == 0
    capsys.readouterr()
    assert main([*root, "--check"]) == 1
    assert set(capsys.readouterr().out.split()) == {r.DATASOURCE_PROVISIONING, r.RULES_PATH}
    # The dashboards themselves do not depend on the settings (they pick the data source by uid).
    for rel in DASHBOARD_FILES:
        assert (tmp_path / rel).read_text() == r.artifacts()[rel]


def test_the_settings_have_environment_twins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUDITOR_DATASOURCE_URL", "http://10.0.0.5:9090")
    monkeypatch.setenv("AUDITOR_NODES_SCRAPE_JOB", "gpu-nodes")
    monkeypatch.setenv("AUDITOR_SERVE_SCRAPE_JOB", "gpu-serve")
    assert main(["dashboards", "render", "--root", str(tmp_path)]) == 0
    text = (tmp_path / r.DATASOURCE_PROVISIONING).read_text()
    assert "    url: http://10.0.0.5:9090\n" in text
    assert 'up{job=~"gpu-nodes|gpu-serve"} == 0' in (tmp_path / r.RULES_PATH).read_text()
    # The command line wins over the twin.
    argv = ["dashboards", "render", "--root", str(tmp_path), "--datasource-url", r.PROMETHEUS_URL]
    assert main(argv) == 0
    assert f"    url: {r.PROMETHEUS_URL}\n" in (tmp_path / r.DATASOURCE_PROVISIONING).read_text()


def test_the_defaults_render_the_committed_provisioning() -> None:
    assert r.provisioning() == r.DEFAULT == r.Provisioning()
    assert r.artifacts(r.DEFAULT) == r.artifacts()
    committed = (REPO / r.DATASOURCE_PROVISIONING).read_text()
    assert f"    url: {r.PROMETHEUS_URL}\n" in committed


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--datasource-url", "prometheus:9090", "data source URL"),
        ("--datasource-url", "ftp://prometheus:9090", "data source URL"),
        ("--datasource-url", "http://prometheus:9090/ x", "data source URL"),
        ("--datasource-url", "http://prometheus:9090/#x", "data source URL"),
        ("--nodes-scrape-job", "auditor nodes", "scrape job"),
        ("--serve-scrape-job", 'a"b', "scrape job"),
        ("--serve-scrape-job", "auditor-.*", "scrape job"),
    ],
)
def test_a_bad_setting_is_one_line_and_writes_nothing(
    tmp_path: Path, option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "render", "--root", str(tmp_path), option, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("auditor: error: ") and message in err
    assert not list(tmp_path.iterdir())
