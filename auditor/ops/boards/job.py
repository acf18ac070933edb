"""One training job, rank by rank: where each step's time goes, batches, GPUs, CPU and DataLoader
workers, findings."""

from __future__ import annotations

from auditor.metrics import catalog as C
from auditor.ops import recording as R
from auditor.ops.boards.common import (
    BUSY_THRESHOLDS,
    JOB,
    MFU_NOT_MEASURED,
    MFU_THRESHOLDS,
    OWNED,
    PERCENT,
    PHASE_TITLES,
    RANK,
    SPEEDUP_UNIT,
    TAGS,
    alarm_from,
    dashed,
    findings_table,
    fixes_table,
    instant,
    links,
    max_by,
    organize,
    phase,
    phase_breakdown,
    sel,
    series,
    stat,
    variables,
)
from auditor.ops.grafana import Dashboard, Row, Table, TimeSeries
from auditor.samples import PHASES

RANK_LEGEND = "rank {{rank}}"
GPU_LEGEND = "rank {{rank}}: {{node}} gpu {{gpu}}"


def job_view() -> Dashboard:
    # rank="" is a job-wide finding: kept whichever ranks are selected.
    findings = Row(
        title="Findings of the job",
        panels=(
            findings_table(JOB, 'rank=~"$rank|"', w=24, h=7),
            fixes_table(JOB, 'rank=~"$rank|"'),
        ),
    )
    return Dashboard(
        uid="auditor-job",
        title="GPU Balance Auditor: job",
        description="One training job rank by rank: where each step's time goes, batches, "
        "GPUs, CPU and DataLoader workers, findings. Pick one job.",
        tags=TAGS,
        rows=(
            _stats(),
            _work(),
            _step(),
            Row(title="Step breakdown of each rank", panels=(_breakdown_panel(),)),
            _batches(),
            _gpus(),
            _cpu(),
            findings,
        ),
        variables=variables(),
        links=links(),
    )


def _stats() -> Row:
    ranks_up = max_by("auditor_job, rank", sel(C.RANK_UP.name, JOB))
    return Row(
        title="Job",
        panels=(
            stat("Ranks up", f"count by (auditor_job) ({ranks_up} == 1)"),
            stat(
                "Samples per second",
                sel(R.JOB_SAMPLES_RATE.record, JOB),
                decimals=1,
                graph=True,
            ),
            stat(
                "GPU busy (5m mean)",
                sel(R.JOB_GPU_UTILIZATION_AVG.record, JOB),
                unit="percentunit",
                thresholds=BUSY_THRESHOLDS,
            ),
            stat(
                "GPU busy spread (busiest - idlest)",
                sel(R.JOB_GPU_UTILIZATION_SPREAD.record, JOB),
                unit="percentunit",
                thresholds=alarm_from(0.2, "orange"),
            ),
            stat(
                "Imbalance",
                max_by("auditor_job", sel(C.JOB_IMBALANCE_RATIO.name, JOB)),
                unit="percentunit",
                thresholds=alarm_from(0.1, "orange"),
            ),
            stat(
                "Predicted speed-up",
                max_by("auditor_job", sel(C.JOB_PREDICTED_SPEEDUP.name, JOB)),
                unit=SPEEDUP_UNIT,
                decimals=2,
            ),
        ),
    )


def _work() -> Row:
    """What the job's GPUs achieve: MFU for the job and per rank, and the counted FLOPs."""
    return Row(
        title="Model FLOPs utilisation",
        panels=(
            stat(
                "Job MFU",
                max_by("auditor_job", sel(C.JOB_MFU_RATIO.name, JOB)),
                description="Model FLOPs utilisation of the whole run: the time the job's "
                "counted FLOPs would take at its GPUs' dense peaks (for the dtypes they ran in) "
                "over the time it took. " + MFU_NOT_MEASURED,
                unit="percentunit",
                decimals=1,
                thresholds=MFU_THRESHOLDS,
                h=8,
            ),
            series(
                "MFU per rank",
                (sel(C.RANK_MFU_RATIO.name, JOB, RANK), RANK_LEGEND),
                description="Achieved FLOP/s over the device's dense peak for the dtypes the "
                "rank's FLOPs ran in. " + MFU_NOT_MEASURED,
                w=7,
                **PERCENT,
            ),
            series(
                "Achieved FLOP/s per rank",
                (sel(C.RANK_FLOPS_PER_SECOND.name, JOB, RANK), RANK_LEGEND),
                description="The rank's counted FLOPs per step over its step time (on a CPU "
                "rank, the only figure: no peak to judge it by).",
                w=7,
                unit="flops",
                min=0,
            ),
            series(
                "FLOPs per step per rank",
                (sel(C.RANK_FLOPS_PER_STEP.name, JOB, RANK), RANK_LEGEND),
                description="Forward and backward of every micro-batch, counted from the "
                "operations that ran on a sampled step (recounted when the batch shape "
                "changes).",
                w=6,
                unit="short",
                min=0,
            ),
        ),
    )


def _step() -> Row:
    # (phase, title, description) of the "share of the step" panels
    shares = (
        (
            "data_wait",
            "Data wait share per rank",
            "Share of the step spent waiting for the DataLoader: a starved rank stands out here.",
        ),
        (
            "collective_wait",
            "Collective wait share per rank",
            "Share of the step spent waiting for the other ranks in the all-reduce. The rank "
            "that waits least is the one the others wait for.",
        ),
    )
    return Row(
        title="Step time per rank",
        panels=(
            series(
                "Step time per rank",
                (sel(R.RANK_STEP_SECONDS_MEAN.record, JOB, RANK), RANK_LEGEND),
                w=8,
                unit="s",
            ),
            *(
                series(
                    title,
                    (sel(R.RANK_PHASE_RATIO.record, JOB, RANK, f'phase="{name}"'), RANK_LEGEND),
                    description=description,
                    w=8,
                    **PERCENT,
                )
                for name, title, description in shares
            ),
            _breakdown_table(),
        ),
    )


def _batches() -> Row:
    return Row(
        title="Batches",
        panels=(
            series(
                "Batch size per rank",
                (sel(C.RANK_BATCH_SIZE.name, JOB, RANK), RANK_LEGEND),
                w=12,
            ),
            series(
                "Samples per second per rank",
                (sel(R.RANK_SAMPLES_RATE.record, JOB, RANK), RANK_LEGEND),
                w=12,
            ),
        ),
    )


def _gpus() -> Row:
    used = sel(C.GPU_MEMORY_USED_BYTES.name, JOB, OWNED, RANK)
    total = sel(C.GPU_MEMORY_TOTAL_BYTES.name, JOB, OWNED, RANK)
    memory = sel(C.RANK_MEMORY_BYTES.name, JOB, RANK, 'memory=~"allocated|reserved|peak"')
    return Row(
        title="GPUs of the job",
        panels=(
            series(
                "GPU busy per GPU",
                (sel(C.GPU_UTILIZATION_RATIO.name, JOB, OWNED, RANK), GPU_LEGEND),
                w=8,
                **PERCENT,
            ),
            series(
                "GPU memory used / total per GPU",
                (f"{used} / {total}", GPU_LEGEND),
                w=8,
                **PERCENT,
            ),
            series(
                "Rank device memory (allocated, reserved, peak)",
                (memory, "rank {{rank}} {{memory}}"),
                description="What PyTorch's allocator holds on each rank's device.",
                w=8,
                unit="bytes",
            ),
        ),
    )


def _cpu() -> Row:
    return Row(
        title="CPU and DataLoader",
        panels=(
            series(
                "Rank CPU cores (main process / DataLoader workers)",
                (sel(C.RANK_CPU_CORES.name, JOB, RANK), "rank {{rank}} {{process}}"),
                description="1.0 = one core fully busy. workers: all the rank's DataLoader "
                "workers together.",
                w=12,
            ),
            series(
                "DataLoader workers (alive / configured)",
                (sel(C.RANK_DATALOADER_WORKERS.name, JOB, RANK), "rank {{rank}} alive"),
                (
                    sel(C.RANK_DATALOADER_CONFIG_WORKERS.name, JOB, RANK),
                    "rank {{rank}} configured",
                ),
                w=12,
                overrides=(dashed(".* configured$"),),
            ),
        ),
    )


def _breakdown_panel() -> TimeSeries:
    """The stacked step breakdown, repeated for each selected rank; the stack sums to the
    measured part of the step and the dashed line is the whole step."""
    return series(
        "Step breakdown: rank $rank",
        *((phase(name, JOB, RANK), PHASE_TITLES[name]) for name in PHASES),
        (sel(R.RANK_STEP_SECONDS_MEAN.record, JOB, RANK), "step time"),
        description="Mean seconds per step in each phase (1 m). The phases are exclusive "
        "(backward excludes the collective wait inside it); the dashed line is the whole step.",
        w=12,
        h=8,
        unit="s",
        stack=True,
        fill=60,
        repeat="rank",
        max_per_row=2,
        legend_calcs=("lastNotNull",),
        legend_placement="right",
        overrides=(dashed("^step time$"),),
    )


def _breakdown_table() -> Table:
    """Latest seconds per step of each phase: a row per rank, a column per phase."""
    return Table(
        title="Step breakdown by rank (seconds per step, 1 m mean)",
        description="backward (compute) excludes the collective wait inside backward.",
        w=24,
        h=8,
        unit="s",
        decimals=3,
        targets=(instant(phase_breakdown(JOB, RANK)),),
        transformations=(
            {
                "id": "groupingToMatrix",
                "options": {"columnField": "phase", "rowField": "rank", "valueField": "Value"},
            },
            organize(
                order=("rank\\phase", *PHASES),
                rename={"rank\\phase": "rank", **{p: PHASE_TITLES[p] for p in PHASES}},
            ),
        ),
        sort_by="rank",
        sort_desc=False,
    )
