"""deploy/kubernetes/pytorchjob.yaml: a PyTorchJob whose pods run under ``auditor run``.

The YAML parses; both replicas run the same entrypoint, which is the one deploy/README.md
gives; that command parses as ``auditor run`` options (a Ray address, the metrics endpoint the
scrape annotations name, ``python train.py`` with no launcher); and the pod's labels are mounted
where the auditor reads the PyTorchJob's name.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from auditor.cli import build_parser
from auditor.cli.run import run_config
from auditor.launch_env import POD_LABELS_FILE, identify, parse_labels

ROOT = Path(__file__).resolve().parents[2]
JOB_FILE = ROOT / "deploy" / "kubernetes" / "pytorchjob.yaml"
GUIDE = ROOT / "deploy" / "README.md"


def _job() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(JOB_FILE.read_text(encoding="utf-8")) if d]
    assert len(docs) == 1
    job: dict[str, Any] = docs[0]
    return job


def _templates() -> dict[str, dict[str, Any]]:
    specs = _job()["spec"]["pytorchReplicaSpecs"]
    return {kind: spec["template"] for kind, spec in specs.items()}


def _script() -> list[str]:
    (container,) = _templates()["Master"]["spec"]["containers"]
    assert container["command"] == ["/bin/bash", "-c"]
    (script,) = container["args"]
    return [line.strip() for line in script.strip().splitlines()]


def test_it_is_a_pytorchjob_with_a_master_and_a_worker() -> None:
    job = _job()
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    templates = _templates()
    assert set(templates) == {"Master", "Worker"}
    assert templates["Master"] == templates["Worker"]  # every pod runs the same entrypoint


def test_the_entrypoint_is_the_one_the_guide_gives() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    lines = _script()
    assert lines[0].startswith("ray start --address=")
    assert lines[1].startswith("exec auditor run ")
    for line in lines:
        assert line in guide, f"deploy/README.md does not give: {line}"


def test_the_entrypoint_parses_as_auditor_run() -> None:
    argv = shlex.split(_script()[1].replace('"$RAY_HEAD"', "gpu-train-head-svc:6379"))
    assert argv[:3] == ["exec", "auditor", "run"]
    args = argv[2:]
    i = args.index("--")
    cfg = run_config(build_parser().parse_args(args[:i]), args[i + 1 :], {})
    assert cfg.address == "gpu-train-head-svc:6379"
    assert cfg.metrics_host == "0.0.0.0"
    assert cfg.command == ("python", "/workspace/train.py")  # no launcher in the pod
    pod = _templates()["Master"]
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(cfg.metrics_port)
    assert notes["prometheus.io/path"] == "/metrics"
    (container,) = pod["spec"]["containers"]
    assert {p["containerPort"] for p in container["ports"]} == {cfg.metrics_port}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RAY_HEAD"] == "gpu-train-head-svc:6379"  # deploy/kuberay's head service
    assert env["RAY_AUTH_MODE"] == "token"


def test_the_pod_labels_are_where_the_auditor_reads_the_job_name() -> None:
    pod = _templates()["Master"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (podinfo,) = [v for v in pod["volumes"] if v["name"] == "podinfo"]
    (item,) = podinfo["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == "metadata.labels"
    assert f"{mounts['podinfo']}/{item['path']}" == POD_LABELS_FILE
    # What the operator's labels and environment then give the auditor in the worker pod.
    labels = parse_labels(
        'training.kubeflow.org/job-name="resnet-ddp"\ntraining.kubeflow.org/replica-type="worker"'
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "RANK": "1", "WORLD_SIZE": "2"}
    env.update(MASTER_ADDR="resnet-ddp-master-0", MASTER_PORT="23456")
    launch = identify(["python", "/workspace/train.py"], env, labels)
    assert launch.job_label == _job()["metadata"]["name"]
    assert (launch.within, launch.scheduler, launch.member) == ("pod", "kubernetes", "rank1")
