"""The operator configs under deploy/ parse, pass the upstream checkers and agree with each other.

promtool (Debian's prometheus package) and amtool (prometheus-alertmanager) check the Prometheus
and Alertmanager configs for real; the compose stack and the KubeRay manifests are checked for
the contract between the files: which services exist, what they publish and mount, which labels
the scrapes keep and which names one file expects of another.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_quietly
from tests.servers import Alertmanager

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"
PROM_CONFIG = PROM_DIR / "prometheus.yml"
RULES_FILE = PROM_DIR / "rules" / "auditor.rules.yml"
EXAMPLE_TARGETS = PROM_DIR / "targets" / "example.json"
AM_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
KUBERAY = DEPLOY / "kuberay"
PROVISIONING = ROOT / "dashboards" / "provisioning"

# The alert names the Alertmanager routes and the operator guide refer to.
ALERTS = {
    "AuditorUnderusedMultiGpuNode",
    "AuditorGpuUtilizationSpread",
    "AuditorDataStarvedRank",
    "AuditorIdleAllocatedGpu",
    "AuditorExporterDown",
    "AuditorGpuMonitorDown",
    "AuditorGpuSamplesStale",
    "AuditorGpuLost",
    "AuditorServeStale",
    "AuditorCriticalFinding",
    "AuditorRankMemoryFillingUp",
}
# The alerts about one node's GPUs and ranks: a down node endpoint silences them for that node.
NODE_SCOPED_ALERTS = {
    "AuditorUnderusedMultiGpuNode",
    "AuditorDataStarvedRank",
    "AuditorIdleAllocatedGpu",
    "AuditorGpuMonitorDown",
    "AuditorGpuSamplesStale",
    "AuditorGpuLost",
    "AuditorRankMemoryFillingUp",
}
COMPOSE_SERVICES = {"prometheus", "alertmanager", "grafana", "auditor-serve"}
# Where the compose stack mounts the generated dashboards inside the Grafana container.
GRAFANA_DASHBOARDS_DIR = "/var/lib/grafana/dashboards"


def _yaml_files() -> list[Path]:
    files = [*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    if PROVISIONING.is_dir():
        files += [*PROVISIONING.rglob("*.yml"), *PROVISIONING.rglob("*.yaml")]
    return sorted(files)


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _load_all(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _run(*cmd: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def _by_kind(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in _load_all(path):
        out.setdefault(doc["kind"], []).append(doc)
    return out


def _scrape_job(name: str) -> dict[str, Any]:
    jobs = {j["job_name"]: j for j in _load(PROM_CONFIG)["scrape_configs"]}
    assert name in jobs, f"prometheus.yml has no scrape job {name!r} (has {sorted(jobs)})"
    return jobs[name]


def _rule_alerts() -> list[dict[str, Any]]:
    """The alerting rules of the generated rules file."""
    assert RULES_FILE.is_file(), f"{RULES_FILE.relative_to(ROOT)} is missing"
    groups = (_load(RULES_FILE) or {}).get("groups") or []
    return [r for g in groups for r in g.get("rules", []) if "alert" in r]


# --- every YAML file ------------------------------------------------------------------------


def test_the_expected_files_exist() -> None:
    for path in (
        DEPLOY / "README.md",
        PROM_CONFIG,
        EXAMPLE_TARGETS,
        AM_CONFIG,
        COMPOSE_FILE,
        COMPOSE_DIR / "Dockerfile",
        COMPOSE_DIR / ".env.example",
        KUBERAY / "raycluster.yaml",
        KUBERAY / "podmonitor.yaml",
        KUBERAY / "auditor-serve.yaml",
        KUBERAY / "Dockerfile",
    ):
        assert path.is_file(), f"missing {path.relative_to(ROOT)}"


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    docs = _load_all(path)
    assert docs, f"{path.relative_to(ROOT)} holds no YAML document"
    assert all(isinstance(d, dict) for d in docs)


# --- Prometheus -----------------------------------------------------------------------------


def test_promtool_check_config() -> None:
    """The config as shipped, with the rules file it names (promtool checks that too)."""
    promtool = require_tool("promtool")
    res = _run(promtool, "check", "config", str(PROM_CONFIG.relative_to(ROOT)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_accepts_the_example_targets(tmp_path: Path) -> None:
    """The example file_sd JSON, placed where the auditor-nodes job looks, passes promtool."""
    promtool = require_tool("promtool")
    shutil.copy(PROM_CONFIG, tmp_path / "prometheus.yml")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "auditor.rules.yml").write_text("groups: []\n", encoding="utf-8")
    (tmp_path / "targets").mkdir()
    shutil.copy(EXAMPLE_TARGETS, tmp_path / "targets" / "auditor-nodes.json")
    res = _run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "does not exist" not in res.stdout + res.stderr, "the SD file was not checked"


@pytest.mark.parametrize("job", ["auditor-nodes", "auditor-serve"])
def test_auditor_scrapes_keep_the_default_honor_labels(job: str) -> None:
    # The training job travels in `auditor_job`, which Prometheus does not reserve: `job` is the
    # scrape job, and a default scrape config (honor_labels false) is all the auditor needs.
    assert _scrape_job(job).get("honor_labels", False) is False


def test_nodes_come_from_the_fleet_sd_file_and_the_example_is_not_scraped() -> None:
    sd = _scrape_job("auditor-nodes")["file_sd_configs"]
    patterns = [f for entry in sd for f in entry["files"]]
    assert patterns
    # What `auditor fleet --sd-file deploy/prometheus/targets/auditor-nodes.json` writes is read.
    assert any(fnmatch.fnmatch("targets/auditor-nodes.json", p) for p in patterns), patterns
    # The example's made-up endpoints would raise AuditorExporterDown if they were scraped.
    example = str(EXAMPLE_TARGETS.relative_to(PROM_DIR))
    assert not any(fnmatch.fnmatch(example, p) for p in patterns), patterns


def test_example_targets_have_the_fleet_sd_shape() -> None:
    entries = json.loads(EXAMPLE_TARGETS.read_text(encoding="utf-8"))
    assert isinstance(entries, list) and entries
    for entry in entries:
        assert set(entry) == {"targets", "labels"}
        # No target labels: the series carry node and auditor_job themselves, and a target label
        # of the same name would rename theirs to exported_* under the default honor_labels.
        assert entry["labels"] == {}
        for target in entry["targets"]:
            host, _, port = target.rpartition(":")
            assert host and port.isdigit()


def test_prometheus_names_the_rules_file_and_alertmanager() -> None:
    config = _load(PROM_CONFIG)
    rule_files = [PROM_DIR / p for p in config["rule_files"]]
    assert RULES_FILE in rule_files
    targets = [
        t
        for am in config["alerting"]["alertmanagers"]
        for sc in am["static_configs"]
        for t in sc["targets"]
    ]
    assert targets == ["alertmanager:9093"]


def test_serve_target_is_the_compose_service() -> None:
    targets = [t for sc in _scrape_job("auditor-serve")["static_configs"] for t in sc["targets"]]
    assert targets == ["auditor-serve:9410"]
    assert "auditor-serve" in _load(COMPOSE_FILE)["services"]


# --- Alertmanager ---------------------------------------------------------------------------


def test_amtool_check_config() -> None:
    amtool = require_tool("amtool")
    res = _run(amtool, "check-config", str(AM_CONFIG.relative_to(ROOT)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=AuditorGpuLost"], "pager"),
        (["severity=warning", "alertname=AuditorDataStarvedRank"], "chat"),
    ],
)
def test_routes_by_severity(labels: list[str], receiver: str) -> None:
    amtool = require_tool("amtool")
    res = _run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={AM_CONFIG}",
        f"--verify.receivers={receiver}",
        *labels,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == receiver


def test_grouping_and_exporter_down_inhibition() -> None:
    config = _load(AM_CONFIG)
    assert config["route"]["group_by"] == ["alertname", "auditor_job", "job", "node"]
    (rule,) = config["inhibit_rules"]
    # Only a node endpoint's outage inhibits: `auditor serve`'s `up` has no node label, and
    # Alertmanager counts two missing labels as equal.
    assert set(rule["source_matchers"]) == {
        'alertname="AuditorExporterDown"',
        'job="auditor-nodes"',
    }
    assert rule["equal"] == ["node"]
    (target,) = rule["target_matchers"]
    inhibited = set(target.split("=~", 1)[1].strip('"').split("|"))
    assert inhibited == NODE_SCOPED_ALERTS


def test_a_real_alertmanager_routes_and_inhibits(tmp_path: Path) -> None:
    """The shipped config in a real Alertmanager: a node's ExporterDown suppresses that node's
    GPU alert only; serve's ExporterDown and the job-wide spread alert suppress nothing."""
    am = Alertmanager(tmp_path, AM_CONFIG)
    try:
        am.start(timeout=30)
        expected = {
            ("AuditorExporterDown", "auditor-nodes", "a"): ("active", ["pager"]),
            ("AuditorExporterDown", "auditor-serve", None): ("active", ["pager"]),
            ("AuditorIdleAllocatedGpu", "train", "a"): ("suppressed", ["chat"]),
            ("AuditorIdleAllocatedGpu", "train", "b"): ("active", ["chat"]),
            ("AuditorGpuUtilizationSpread", "train", None): ("active", ["chat"]),
        }
        crit, warn = {"severity": "critical"}, {"severity": "warning"}
        idle = {"auditor_job": "train", "job": "auditor-nodes"}
        alerts = [
            {"alertname": "AuditorExporterDown", "job": "auditor-nodes", "node": "a", **crit},
            {"alertname": "AuditorExporterDown", "job": "auditor-serve", **crit},
            # Training-job alerts carry the training job in auditor_job; a per-GPU alert keeps
            # the scrape job of its series too.
            {"alertname": "AuditorIdleAllocatedGpu", **idle, "node": "a", **warn},
            {"alertname": "AuditorIdleAllocatedGpu", **idle, "node": "b", **warn},
            {"alertname": "AuditorGpuUtilizationSpread", "auditor_job": "train", **warn},
        ]
        am.post_alerts(alerts)
        # The inhibitor learns of new alerts asynchronously: poll until the states settle.
        got: dict[tuple[str, str, str | None], tuple[str, list[str]]] = {}

        def settled() -> bool:
            got.clear()
            got.update(
                {
                    (
                        a["labels"]["alertname"],
                        a["labels"].get("auditor_job", a["labels"].get("job", "")),
                        a["labels"].get("node"),
                    ): (
                        a["status"]["state"],
                        [r["name"] for r in a["receivers"]],
                    )
                    for a in am.alerts()
                }
            )
            return got == expected

        # Not settled in time: the assert below shows the states as they were.
        wait_quietly(settled, timeout=15, every=0.2)
    finally:
        am.stop()
    assert got == expected


def test_every_generated_alert_routes_and_is_known() -> None:
    alerts = _rule_alerts()
    names = {a["alert"] for a in alerts}
    assert names >= ALERTS, f"alerts the routes expect but the rules lack: {ALERTS - names}"
    for alert in alerts:
        severity = alert.get("labels", {}).get("severity")
        assert severity in {"warning", "critical"}, f"{alert['alert']}: severity={severity!r}"


def test_alert_rules_watch_the_scrape_jobs_prometheus_defines() -> None:
    from auditor.ops import alerts

    jobs = {j["job_name"] for j in _load(PROM_CONFIG)["scrape_configs"]}
    assert {alerts.NODES_SCRAPE_JOB, alerts.SERVE_SCRAPE_JOB} <= jobs
    assert {a.name for a in alerts.ALERT_RULES} == ALERTS
    assert {a.name for a in alerts.ALERT_RULES if a.severity == "critical"} >= {
        "AuditorExporterDown",
        "AuditorGpuLost",
    }


def test_the_operator_guide_tables_every_alert() -> None:
    from auditor.ops import alerts

    rows = {
        line.split("|")[1].strip().strip("`"): [c.strip() for c in line.split("|")[2:-1]]
        for line in (DEPLOY / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `Auditor")
    }
    assert set(rows) == {a.name for a in alerts.ALERT_RULES}
    for a in alerts.ALERT_RULES:
        severity, what, for_ = rows[a.name]
        assert (severity, for_) == (a.severity, a.for_), a.name
        assert ("(node-level)" in what) == (a.name in NODE_SCOPED_ALERTS), a.name


# --- compose --------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return _load(COMPOSE_FILE)


def _services() -> dict[str, Any]:
    """The stack's services, the four of them: a check looping over none would check nothing."""
    services: dict[str, Any] = _compose()["services"]
    assert set(services) == COMPOSE_SERVICES
    return services


def test_compose_has_the_four_services() -> None:
    assert set(_compose()["services"]) == COMPOSE_SERVICES


def test_compose_publishes_on_loopback_only() -> None:
    published = []
    for name, service in _services().items():
        assert "network_mode" not in service, name
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)
            assert port.count(":") == 2, (name, port)
            published.append(name)
    assert sorted(published) == sorted(COMPOSE_SERVICES), "each service publishes one port"


def test_compose_mounts_exist() -> None:
    compose = _compose()
    named = set(compose.get("volumes") or {})
    services = _services()
    mounts = [v for service in services.values() for v in service.get("volumes", [])]
    assert mounts, "the stack mounts nothing to check"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert not source.startswith("/"), f"{name}: absolute host path {source}"
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in named, f"{name}: undeclared volume {source}"
        build = service.get("build")
        if build:
            context = COMPOSE_DIR / build["context"]
            assert context.is_dir(), name
            assert (context / build["dockerfile"]).is_file(), name


def test_compose_images_are_pinned() -> None:
    for name, service in _services().items():
        image = service["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image else ""
        assert tag and tag != "latest", f"{name}: {image}"


def test_compose_grafana_secrets_come_from_env_file() -> None:
    grafana = _compose()["services"]["grafana"]
    assert grafana["env_file"] == [".env"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert not any("PASSWORD" in key for key in env)
    example = (COMPOSE_DIR / ".env.example").read_text(encoding="utf-8")
    assert "GF_SECURITY_ADMIN_PASSWORD=" in example
    ignored = (COMPOSE_DIR / ".gitignore").read_text(encoding="utf-8").split()
    assert ".env" in ignored


def test_compose_runs_serve_against_the_compose_prometheus() -> None:
    serve = _compose()["services"]["auditor-serve"]
    assert serve["command"] == [
        "auditor",
        "serve",
        "--prometheus-url",
        "http://prometheus:9090",
        "--host",
        "0.0.0.0",
    ]
    assert "127.0.0.1:9410:9410" in serve["ports"]


def test_compose_grafana_mounts_the_provisioning_and_dashboards() -> None:
    mounts = {
        PurePosixPath(v.split(":")[1]): (COMPOSE_DIR / v.split(":")[0]).resolve()
        for v in _compose()["services"]["grafana"]["volumes"]
        if v.startswith(".")
    }
    assert mounts[PurePosixPath(GRAFANA_DASHBOARDS_DIR)] == ROOT / "dashboards"
    for kind in ("datasources", "dashboards"):
        assert mounts[PurePosixPath("/etc/grafana/provisioning") / kind] == PROVISIONING / kind


def test_grafana_provisioning_matches_the_compose_stack() -> None:
    datasources = PROVISIONING / "datasources" / "auditor.yml"
    dashboards = PROVISIONING / "dashboards" / "auditor.yml"
    assert datasources.is_file() and dashboards.is_file(), "dashboards/provisioning is missing"
    urls = [ds.get("url", "") for ds in _load(datasources).get("datasources", [])]
    assert "http://prometheus:9090" in urls, urls
    paths = [p["options"]["path"] for p in _load(dashboards)["providers"]]
    assert paths
    for path in paths:
        assert PurePosixPath(path).is_relative_to(GRAFANA_DASHBOARDS_DIR), path


# --- KubeRay --------------------------------------------------------------------------------


def _ray_containers(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    spec = cluster["spec"]
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    return [c for pod in pods for c in pod["spec"]["containers"]]


def test_raycluster_head_runs_the_fleet_and_workers_have_gpus() -> None:
    (cluster,) = _by_kind(KUBERAY / "raycluster.yaml")["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    fleet = [
        c for c in head if "auditor fleet" in " ".join(c.get("command", []) + c.get("args", []))
    ]
    assert len(fleet) == 1, "one head container runs `auditor fleet`"
    fleet_cmd = " ".join(fleet[0].get("command", []) + fleet[0].get("args", []))
    assert "--address auto" in fleet_cmd
    assert "--metrics-host 0.0.0.0" in fleet_cmd
    assert "--metrics-port-base 9411" in fleet_cmd
    workers = cluster["spec"]["workerGroupSpecs"]
    assert workers
    for group in workers:
        (container,) = group["template"]["spec"]["containers"]
        assert "nvidia.com/gpu" in container["resources"]["limits"], group["groupName"]


def test_raycluster_exposes_the_metrics_port_and_keeps_token_auth() -> None:
    (cluster,) = _by_kind(KUBERAY / "raycluster.yaml")["RayCluster"]
    containers = _ray_containers(cluster)
    # The fleet's own container, and the Ray containers whose ports are checked.
    assert "auditor-fleet" in {c["name"] for c in containers}
    assert any(c["name"] != "auditor-fleet" for c in containers)
    for container in containers:
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
        assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], container["name"]
        if container["name"] == "auditor-fleet":
            continue
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert ports.get("auditor-metrics") == 9411, container["name"]


def test_podmonitor_scrapes_the_ray_pods_with_default_honor_labels() -> None:
    (cluster,) = _by_kind(KUBERAY / "raycluster.yaml")["RayCluster"]
    (monitor,) = _by_kind(KUBERAY / "podmonitor.yaml")["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint.get("honorLabels", False) is False
    assert endpoint["port"] == "auditor-metrics"
    job = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert [r["replacement"] for r in job] == ["auditor-nodes"]
    # No target label named like a series label: under honorLabels false it would rename the
    # series' own (node -> exported_node).
    series_labels = {"auditor_job", "node", "rank", "local_rank", "gpu", "uuid", "model"}
    assert not {r.get("targetLabel") for r in endpoint["relabelings"]} & series_labels


def test_serve_manifests_fit_together() -> None:
    kinds = _by_kind(KUBERAY / "auditor-serve.yaml")
    assert {k: len(v) for k, v in kinds.items()} == {
        "Deployment": 1,
        "Service": 1,
        "ServiceMonitor": 1,
    }
    (deployment,), (service,), (monitor,) = (
        kinds["Deployment"],
        kinds["Service"],
        kinds["ServiceMonitor"],
    )
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint.get("honorLabels", False) is False
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["auditor", "serve"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("AUDITOR_PROMETHEUS_URL", "").startswith("http")
