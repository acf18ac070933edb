"""auditor doctor: this machine (no GPU), a fake NVML with GPUs, endpoints up and down, Ray
addresses reachable or not."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from telemetry.test_nvml import UUID0, UUID1, FakeLib, two_gpus

from auditor.commands import doctor
from auditor.telemetry.nvml import Nvml


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {
            "/metrics": '# HELP auditor_gpu_up x\nauditor_gpu_up{gpu="0"} 1\n'
            'auditor_rank_up{rank="0"} 1\npython_info 1\n',
            "/-/ready": "Prometheus Server is Ready.\n",
        }
        body = routes.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "not found").encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_base() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_this_machine_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(False, None) == 0
    out, err = capsys.readouterr()
    assert "no NVIDIA driver/GPU found" in out
    assert "Traceback" not in out + err
    assert doctor.main(True, None) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "auditor.doctor/v1"
    assert report["nvml"]["ok"] is False and report["gpus"] == []
    assert report["nvml"]["reason"]
    assert report["ray"]["installed"] is True and report["ray"]["version"]


def test_fake_nvml_with_two_gpus() -> None:
    gpus = two_gpus()
    gpus[1].errors = {"nvmlDeviceGetPowerUsage": pynvml.NVMLError_NotSupported}
    lib = FakeLib(gpus)
    report = doctor.collect(nvml=Nvml(lib), environ={})
    json.dumps(report)
    assert report["nvml"]["ok"] is True
    assert report["nvml"]["driver_version"] == "550.54.15"
    assert report["nvml"]["cuda_driver_version"] == "12.4"
    assert [(g["index"], g["uuid"], g["memory_total_bytes"]) for g in report["gpus"]] == [
        (0, UUID0, 80 << 30),
        (1, UUID1, 80 << 30),
    ]
    assert list(report["nvml"]["missing"]) == ["nvmlDeviceGetPowerUsage"]
    assert lib.inits == lib.shutdowns == 1
    text = doctor.render(report)
    assert "NVIDIA H100 80GB HBM3" in text and UUID1 in text and "30.0 GiB used of 80.0 GiB" in text
    assert "nvmlDeviceGetPowerUsage" in text


def test_driver_not_loaded_is_a_plain_line() -> None:
    lib = FakeLib(two_gpus(), init_error=pynvml.NVMLError_DriverNotLoaded)
    text = doctor.render(doctor.collect(nvml=Nvml(lib), environ={}))
    assert "no NVIDIA driver/GPU found: the NVIDIA driver is not loaded" in text


def test_endpoints_up_and_down(http_base: str) -> None:
    down = f"127.0.0.1:{_closed_port()}"
    report = doctor.collect(
        prometheus_url=http_base, metrics_urls=[http_base, down], environ={}, timeout_s=2.0
    )
    up, gone = report["metrics_endpoints"]
    assert up == {
        "url": f"{http_base}/metrics",
        "up": True,
        "series": 2,
        "detail": "HTTP 200, 2 auditor_* series",
    }
    assert gone["up"] is False and gone["url"] == f"http://{down}/metrics"
    assert report["prometheus"]["ready"] is True
    text = doctor.render(report)
    assert f"{http_base}/metrics: up" in text and f"http://{down}/metrics: DOWN" in text
    assert "ready (HTTP 200" in text
    missing = doctor.check_metrics_endpoint(f"{http_base}/nope")
    assert missing["up"] is False and missing["detail"] == "HTTP 404"


def test_prometheus_down() -> None:
    prom = doctor.check_prometheus(f"http://127.0.0.1:{_closed_port()}", timeout_s=1.0)
    assert prom["ready"] is False and prom["detail"]


def test_ray_address_reachable_or_not(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        ray = doctor.check_ray({"RAY_ADDRESS": f"127.0.0.1:{port}"})
        assert ray["reachable"] is True and ray["address_from"] == "RAY_ADDRESS"
    closed = doctor.check_ray({"RAY_ADDRESS": f"ray://127.0.0.1:{_closed_port()}"}, timeout_s=1)
    assert closed["reachable"] is False
    # RAY_ADDRESS unset or "auto": the latest local cluster, from Ray's own address file.
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_closed_port()}\n")
    latest = doctor.check_ray({"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": "auto"})
    assert latest["address_from"].endswith("ray_current_cluster")
    assert latest["reachable"] is False
    none = doctor.check_ray({"RAY_TMPDIR": str(tmp_path / "empty")})
    assert none["address"] is None and none["reachable"] is None
    assert "embedded Ray" in none["detail"]
    assert "reachable" not in doctor.render({**doctor.collect(environ={}), "ray": none})


def test_internal_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(FakeLib):
        def nvmlInit(self) -> None:
            raise ZeroDivisionError("bug")

    assert doctor.main(False, None, nvml=Nvml(Broken(two_gpus()))) == 1
    out, err = capsys.readouterr()
    assert out == "" and "internal error: ZeroDivisionError: bug" in err


# -- launcher and scheduler (the environments of a real srun task and a PyTorchJob pod) ----------

SRUN_TASK = {
    "SLURMD_NODENAME": "n2",
    "SLURM_CLUSTER_NAME": "auditortest",
    "SLURM_JOB_ID": "4",
    "SLURM_JOB_NAME": "train",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
}


def test_doctor_names_a_slurm_task_and_its_identity() -> None:
    launch = doctor.check_launch(SRUN_TASK, ["python", "train.py"], labels={})
    assert (launch["scheduler"], launch["within"], launch["launcher"]) == (
        "slurm",
        "srun",
        "python",
    )
    assert (launch["rank"], launch["world_size"], launch["node"]) == (1, 2, "n2")
    assert (launch["job"], launch["job_name"]) == ("4", "train")
    assert launch["per_task"] and launch["member"] == "task1"
    text = "\n".join(doctor._launch_lines(launch))
    assert "scheduler slurm; inside srun" in text
    assert "rank 1 (SLURM_PROCID) of 2 (SLURM_STEP_NUM_TASKS)" in text
    assert "node n2 (SLURMD_NODENAME), node rank 1 (SLURM_NODEID)" in text
    assert "job 4 (train) (SLURM_JOB_ID): the auditor_job label" in text
    assert "one auditor per task: as task1" in text


def test_doctor_names_srun_as_the_command_outside_an_allocation() -> None:
    launch = doctor.check_launch({}, ["srun", "-n2", "python", "train.py"], labels={})
    assert (launch["scheduler"], launch["within"], launch["launcher"]) == ("slurm", None, "srun")
    text = "\n".join(doctor._launch_lines(launch))
    assert "the command starts: srun" in text and "run it in sbatch or salloc" in text


def test_doctor_names_a_pytorchjob_pod(tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    labels.write_text('training.kubeflow.org/job-name="bert"\n')
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "RANK": "0", "WORLD_SIZE": "4"}
    env.update(MASTER_ADDR="bert-master-0", MASTER_PORT="23456")
    env["AUDITOR_POD_LABELS"] = str(labels)
    report = doctor.collect(environ=env, nvml=Nvml(FakeLib([])))
    launch = report["launch"]
    assert (launch["scheduler"], launch["within"]) == ("kubernetes", "pod")
    assert launch["job"] == "bert"
    assert launch["sources"]["job"] == "pod label training.kubeflow.org/job-name"
    text = doctor.render(report)
    assert "Launch      scheduler kubernetes; inside pod" in text
    assert "one auditor per pod: as rank0" in text
    json.dumps(report)  # the --json form


def test_doctor_on_a_plain_machine_names_no_launcher() -> None:
    text = "\n".join(doctor._launch_lines(doctor.check_launch({}, (), labels={})))
    assert "scheduler none; no launcher around it" in text
    assert "rank: from each process's group" in text
    assert "job: --job, else the script's name" in text


def test_doctor_cli_takes_the_command_auditor_run_would_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from auditor.cli import main

    assert main(["doctor", "--json", "--", "srun", "-n2", "python", "train.py"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["launch"]["launcher"] == "srun"
    assert report["launch"]["command"] == ["srun", "-n2", "python", "train.py"]
