"""One node: its GPUs (busy, memory, clocks, power, temperature, throttling), its CPU, and the
DataLoader workers of the ranks it runs."""

from __future__ import annotations

from auditor.metrics import catalog as C
from auditor.ops import recording as R
from auditor.ops.boards.common import (
    JOB,
    MFU_NOT_MEASURED,
    NODE,
    PERCENT,
    TAGS,
    dashed,
    findings_table,
    fixes_table,
    instant,
    links,
    max_by,
    organize,
    sel,
    series,
    variables,
)
from auditor.ops.grafana import Dashboard, Row, Table

LEGEND = "{{node}} gpu {{gpu}}"
RANK_LEGEND = "{{auditor_job}} rank {{rank}}"


def _gpu(metric: str) -> str:
    return max_by("node, gpu", sel(metric, NODE))


def _host(metric: str) -> str:
    # One series per node whichever job's agent exported it.
    return max_by("node", sel(metric, NODE))


def node_view() -> Dashboard:
    return Dashboard(
        uid="auditor-node",
        title="GPU Balance Auditor: node",
        description="One node: its GPUs (busy, memory, clocks, power, temperature, throttling), "
        "its CPU, and the DataLoader workers of the ranks it runs.",
        tags=TAGS,
        rows=(
            _gpus(),
            _work(),
            _cpu(),
            _loaders(),
            Row(
                title="Findings on the node",
                panels=(findings_table(JOB, NODE, w=24, h=7), fixes_table(JOB, NODE)),
            ),
        ),
        variables=variables(),
        links=links(),
    )


def _gpus() -> Row:
    inventory = max_by("node, gpu, model, uuid, auditor_job, rank", sel(C.GPU_UP.name, NODE))
    throttled = max_by("node, gpu, reason", sel(C.GPU_THROTTLE_ACTIVE.name, NODE)) + " > 0"
    return Row(
        title="GPUs of the node",
        panels=(
            Table(
                title="GPUs and their owners",
                description="Each GPU's model and the job and rank using it (empty: none).",
                w=24,
                h=6,
                targets=(instant(inventory),),
                transformations=(
                    organize(
                        exclude=("Time",),
                        order=("node", "gpu", "model", "auditor_job", "rank", "uuid", "Value"),
                        rename={"Value": "monitor up"},
                    ),
                ),
                sort_by="gpu",
                sort_desc=False,
            ),
            series("GPU busy", (_gpu(C.GPU_UTILIZATION_RATIO.name), LEGEND), w=12, **PERCENT),
            series(
                "GPU memory used and installed",
                (_gpu(C.GPU_MEMORY_USED_BYTES.name), LEGEND + " used"),
                (_gpu(C.GPU_MEMORY_TOTAL_BYTES.name), LEGEND + " total"),
                w=12,
                unit="bytes",
                overrides=(dashed(".* total$"),),
            ),
            series(
                "Clocks vs maximum (SM and memory)",
                (
                    f"{_gpu(C.GPU_SM_CLOCK_HERTZ.name)} / {_gpu(C.GPU_SM_CLOCK_MAX_HERTZ.name)}",
                    LEGEND + " SM",
                ),
                (
                    f"{_gpu(C.GPU_MEMORY_CLOCK_HERTZ.name)}"
                    f" / {_gpu(C.GPU_MEMORY_CLOCK_MAX_HERTZ.name)}",
                    LEGEND + " memory",
                ),
                description="Current clock as a share of the GPU's maximum: a GPU held well "
                "below its peers is throttled (see the reasons).",
                w=12,
                unit="percentunit",
                min=0,
            ),
            series(
                "Throttle reasons active",
                (throttled, LEGEND + ": {{reason}}"),
                description="1 while NVML reports the clock-event reason active; gpu_idle is "
                "normal for an idle GPU.",
                w=12,
                min=0,
                max=1,
            ),
            series(
                "Power draw vs limit",
                (_gpu(C.GPU_POWER_WATTS.name), LEGEND),
                (_gpu(C.GPU_POWER_LIMIT_WATTS.name), LEGEND + " limit"),
                w=12,
                unit="watt",
                overrides=(dashed(".* limit$"),),
            ),
            series(
                "Temperature",
                (_gpu(C.GPU_TEMPERATURE_CELSIUS.name), LEGEND),
                w=12,
                unit="celsius",
            ),
        ),
    )


def _work() -> Row:
    """What the GPUs of each job on the node achieve: the measure the underused alert judges,
    the ranks' MFU and DCGM's profiling activity."""
    return Row(
        title="Achieved work on the node",
        panels=(
            series(
                "Achieved work per job (what the underused alert judges)",
                (
                    sel(R.NODE_JOB_ACHIEVED_AVG.record, NODE, JOB),
                    "{{auditor_job}} ({{measure}})",
                ),
                description="5-minute mean of the best measure known for each job's GPUs on "
                "the node, named in the legend: mfu (the auditor counts FLOPs in the job), "
                "tensor_pipe_active or sm_active (dcgm-exporter's profiling), gpu_utilization "
                "(NVML's busy time: an occupancy flag, the last resort). "
                "AuditorUnderusedMultiGpuNode fires on this series.",
                w=8,
                **PERCENT,
            ),
            series(
                "MFU per rank",
                (sel(C.RANK_MFU_RATIO.name, NODE, JOB), RANK_LEGEND),
                description="Achieved FLOP/s over the device's dense peak for the dtypes the "
                "rank's FLOPs ran in. " + MFU_NOT_MEASURED,
                w=8,
                **PERCENT,
            ),
            series(
                "Tensor pipe and SM activity (DCGM)",
                (_gpu(C.GPU_TENSOR_PIPE_ACTIVE_RATIO.name), LEGEND + " tensor pipe"),
                (_gpu(C.GPU_SM_ACTIVE_RATIO.name), LEGEND + " SM"),
                description="dcgm-exporter's DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and "
                "DCGM_FI_PROF_SM_ACTIVE (deploy/dcgm/counters.csv): the share of cycles the "
                "tensor pipe ran and an SM had a warp. Empty without dcgm-exporter's profiling "
                "(data-center GPUs only).",
                w=8,
                **PERCENT,
            ),
        ),
    )


def _cpu() -> Row:
    cores = (_host(C.NODE_CPU_CORES.name), "{{node}} cores")
    return Row(
        title="CPU of the node",
        panels=(
            series(
                "CPU cores: available vs busy",
                (_host(C.NODE_CPU_BUSY_CORES.name), "{{node}} busy"),
                cores,
                w=12,
                overrides=(dashed(".* cores$"),),
            ),
            series(
                "Load average (1 m) vs cores",
                (_host(C.NODE_LOAD1.name), "{{node}} load1"),
                cores,
                w=12,
                overrides=(dashed(".* cores$"),),
            ),
        ),
    )


def _loaders() -> Row:
    # (title, description, the per-rank series)
    panels = (
        ("DataLoader workers per rank", "", sel(C.RANK_DATALOADER_WORKERS.name, NODE, JOB)),
        (
            "DataLoader worker CPU cores per rank",
            "All the rank's workers together; 1.0 = one core fully busy.",
            sel(C.RANK_CPU_CORES.name, NODE, JOB, 'process="workers"'),
        ),
        (
            "Main process CPU cores per rank",
            "",
            sel(C.RANK_CPU_CORES.name, NODE, JOB, 'process="main"'),
        ),
    )
    return Row(
        title="Ranks and DataLoaders on the node",
        panels=tuple(
            series(title, (expr, RANK_LEGEND), description=description, w=8)
            for title, description, expr in panels
        ),
    )
