"""The dashboards: Grafana's JSON model, the panels asked for, and queries that are valid PromQL
naming only catalog metrics and recorded series. No Grafana runs here; promtool parses and
evaluates the queries."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from auditor.metrics import catalog as C
from auditor.ops import recording as R
from auditor.ops.boards import (
    DASHBOARDS,
    JOB,
    PHASE_TITLES,
    RANK,
    phase,
    phase_breakdown,
)
from auditor.ops.dashboard_queries import (
    BUILTIN_VALUES,
    panels,
    queries,
    substitute,
    variable_names,
    variable_selectors,
)
from auditor.ops.grafana import GRID_COLUMNS, Dashboard, Row, Target, TimeSeries
from auditor.samples import PHASES
from tests.helpers.tools import require_tool

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
VARIABLES = {"datasource", "job", "node", "rank"}
# Grafana's own variables that panel links and titles may use.
GRAFANA_GLOBALS = {"__value", "__data", "__url_time_range", "__field", "__series"}


def rendered() -> dict[str, dict[str, Any]]:
    return {uid: build().to_dict() for uid, build in DASHBOARDS.items()}


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    # Through JSON, as Grafana reads the files.
    out = {uid: json.loads(json.dumps(d)) for uid, d in rendered().items()}
    assert len(out) == 3, sorted(out)  # every test below checks each of the three
    return out


def content_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(dashboard) if p["type"] != "row"]


def by_title(dashboard: Mapping[str, Any], title: str) -> dict[str, Any]:
    found = [p for p in panels(dashboard) if p.get("title") == title]
    assert len(found) == 1, f"{title!r}: {len(found)} panels"
    return found[0]


def exprs(panel: Mapping[str, Any]) -> list[str]:
    return [t["expr"] for t in panel.get("targets", [])]


# --- a small PromQL metric-name extractor -------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
_KEYWORDS |= {"and", "or", "unless", "offset", "inf", "nan", "atan2"}
# Aggregations may put their grouping before the parenthesis: ``sum by (job) (x)``.
_KEYWORDS |= {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk"}
_KEYWORDS |= {"bottomk", "quantile", "count_values"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads: bare identifiers that are not functions, keywords,
    label names or grouping labels, plus every alternative of a ``__name__=~"a|b"`` matcher."""
    names: set[str] = set()
    for match in re.finditer(r'__name__\s*=~?\s*"([^"]*)"', expr):
        names.update(match.group(1).split("|"))
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if not call and word not in _KEYWORDS:
            names.add(word)
    return names


def test_metric_name_extractor() -> None:
    expr = (
        'sum by (job, rank) (rate(a_total{phase="x", b="y|z"}[5m])) / ignoring(phase) '
        'group_left b:rec:rate1m offset 5m or vector(0) > 1e-9 and label_replace(c, "d", "e", '
        '"", "") + count({__name__=~"f|g", job=~"$job"})'
    )
    assert metric_names(expr) == {"a_total", "b:rec:rate1m", "c", "f", "g"}


# --- Grafana's JSON model ------------------------------------------------------------------------


def test_the_three_dashboards(boards: dict[str, dict[str, Any]]) -> None:
    assert set(boards) == {"auditor-cluster", "auditor-job", "auditor-node"}
    for uid, board in boards.items():
        assert board["uid"] == uid
        assert board["schemaVersion"] == 39
        assert board["id"] is None
        assert board["title"] and "auditor" in board["tags"]
        assert board["time"] == {"from": "now-1h", "to": "now"}
        assert board["refresh"]
        assert isinstance(board["templating"]["list"], list)
        assert board["panels"]
    assert len({b["title"] for b in boards.values()}) == 3


def test_panel_ids_are_unique_and_the_grid_holds(boards: dict[str, dict[str, Any]]) -> None:
    for uid, board in boards.items():
        every = panels(board)
        ids = [p["id"] for p in every]
        assert len(ids) == len(set(ids)), uid
        cells: set[tuple[int, int]] = set()
        for p in every:
            grid = p["gridPos"]
            assert set(grid) == {"x", "y", "w", "h"}
            assert grid["x"] >= 0 and grid["y"] >= 0 and grid["w"] >= 1 and grid["h"] >= 1
            assert grid["x"] + grid["w"] <= GRID_COLUMNS, (uid, p["title"])
            mine = {
                (x, y)
                for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])
            }
            assert not mine & cells, f"{uid}: {p['title']!r} overlaps another panel"
            cells |= mine
            assert p["type"] in {"row", "timeseries", "heatmap", "table", "stat", "text"}
            if p["type"] != "row":
                assert {"fieldConfig", "options"} <= set(p)


def test_targets_have_refids_exprs_and_the_datasource_variable(
    boards: dict[str, dict[str, Any]],
) -> None:
    for board in boards.values():
        for p in content_panels(board):
            targets = p.get("targets", [])
            if p["type"] == "text":
                assert not targets
                continue
            assert targets, p["title"]
            assert p["datasource"] == DATASOURCE
            ref_ids = [t["refId"] for t in targets]
            assert len(ref_ids) == len(set(ref_ids)) and all(ref_ids)
            for t in targets:
                assert t["expr"].strip()
                assert t["datasource"] == DATASOURCE
                assert t["range"] is not t["instant"]
                if p["type"] == "table":
                    assert t["instant"] and t["format"] == "table"


def test_variables(boards: dict[str, dict[str, Any]]) -> None:
    for board in boards.values():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert set(variables) == VARIABLES
        ds = variables["datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        job = variables["job"]
        assert (
            job["type"] == "query"
            and job["definition"] == "label_values(auditor_rank_info, auditor_job)"
        )
        assert job["multi"] and job["includeAll"] and job["allValue"] == ".*"
        assert job["datasource"] == DATASOURCE
        rank = variables["rank"]
        assert rank["definition"] == 'label_values(auditor_rank_info{auditor_job=~"$job"}, rank)'
        assert "$job" in variables["node"]["definition"]
        selectors = dict(variable_selectors(board))
        assert set(selectors) == {"job", "node", "rank"}
        for selector in selectors.values():
            assert metric_names(selector) and metric_names(selector) <= set(C.BY_NAME)


def _references(text: str) -> set[str]:
    return variable_names(text)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_every_variable_used_is_defined(boards: dict[str, dict[str, Any]]) -> None:
    for uid, board in boards.items():
        defined = {v["name"] for v in board["templating"]["list"]}
        for title, expr in queries(board):
            used = _references(expr)
            assert used <= defined | set(BUILTIN_VALUES), (uid, title, used)
        # Titles, text, links, repeats: everything but the queries.
        for text in _strings({k: v for k, v in board.items() if k != "templating"}):
            used = _references(text)
            assert used <= defined | set(BUILTIN_VALUES) | GRAFANA_GLOBALS, (uid, text)
        for p in panels(board):
            if "repeat" in p:
                assert p["repeat"] in defined


def test_template_variables_only_in_regex_matchers(boards: dict[str, dict[str, Any]]) -> None:
    """``=~`` is what makes the All value (``.*``) and multi-value ``(a|b)`` work."""
    templated = 0
    for board in boards.values():
        for title, expr in queries(board):
            bare = re.sub(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', "", expr)
            assert not _references(bare) - set(BUILTIN_VALUES), (title, expr)
            for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', expr):
                if "$" in value:
                    assert op == "=~", (title, label, op, value)
                    templated += 1
    assert templated, "no query selects by a template variable"


def test_every_metric_is_in_the_catalog_or_recorded(boards: dict[str, dict[str, Any]]) -> None:
    known = set(C.BY_NAME) | set(R.RECORDED)
    seen: set[str] = set()
    for board in boards.values():
        for title, expr in queries(board):
            names = metric_names(expr)
            assert names, (title, expr)
            assert names <= known, (title, names - known)
            seen |= names
    # The dashboards chart the GPU, rank, node, findings and serve families, and recorded series.
    for name in (
        C.GPU_UTILIZATION_RATIO.name,
        C.RANK_BATCH_SIZE.name,
        C.NODE_LOAD1.name,
        C.FINDING.name,
        C.SERVE_PROMETHEUS_UP.name,
        R.RANK_PHASE_SECONDS_MEAN.record,
        R.NODE_JOB_GPU_UTILIZATION_AVG.record,
    ):
        assert name in seen


# --- the panels asked for ------------------------------------------------------------------------


def test_cluster_overview_panels(boards: dict[str, dict[str, Any]]) -> None:
    board = boards["auditor-cluster"]
    heat = by_title(board, "GPU busy by node")
    assert heat["type"] == "heatmap"
    assert heat["options"]["calculate"] is False
    assert heat["targets"][0]["legendFormat"] == "{{node}} gpu {{gpu}}"
    assert metric_names(heat["targets"][0]["expr"]) == {C.GPU_UTILIZATION_RATIO.name}
    # An idle GPU (0) is a cell, not a gap.
    assert heat["options"]["filterValues"]["le"] < 0

    underused = by_title(board, "GPU busy per node and job (5 m mean), least busy first")
    assert underused["type"] == "table"
    names = set().union(*(metric_names(e) for e in exprs(underused)))
    assert names == {R.NODE_JOB_GPU_UTILIZATION_AVG.record, R.NODE_JOB_GPUS.record}

    findings = by_title(board, "Current findings")
    assert findings["type"] == "table"
    finding, speedup = exprs(findings)
    assert metric_names(finding) == {C.FINDING.name}
    assert C.FINDING_PREDICTED_SPEEDUP.name in metric_names(speedup)
    for label in ("auditor_job", "kind", "rank", "node", "severity"):
        assert label in finding
    assert "merge" in [t["id"] for t in findings["transformations"]]

    fixes = by_title(board, "What to change, per rank")
    assert fixes["type"] == "table"
    (fix,) = exprs(fixes)
    assert metric_names(fix) == {C.FINDING_FIX_INFO.name}
    for label in ("auditor_job", "kind", "rank", "node", "fix"):
        assert label in fix

    imbalance = by_title(board, "Job imbalance ratio")
    assert metric_names(exprs(imbalance)[0]) == {C.JOB_IMBALANCE_RATIO.name}
    samples = by_title(board, "Samples per second per job")
    assert metric_names(exprs(samples)[0]) == {R.JOB_SAMPLES_RATE.record}
    up = by_title(board, "Prometheus reachable")
    assert metric_names(exprs(up)[0]) == {C.SERVE_PROMETHEUS_UP.name}
    age = exprs(by_title(board, "Last evaluation age"))[0]
    assert age.startswith("time() - ")
    assert metric_names(age) == {C.SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS.name}


def _stacked_breakdown(board: Mapping[str, Any]) -> dict[str, Any]:
    found = [p for p in content_panels(board) if p.get("repeat") == "rank"]
    assert len(found) == 1
    return found[0]


def test_job_view_stacks_all_six_phases_per_rank(boards: dict[str, dict[str, Any]]) -> None:
    panel = _stacked_breakdown(boards["auditor-job"])
    assert panel["type"] == "timeseries"
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    targets = panel["targets"]
    legends = [t["legendFormat"] for t in targets]
    assert legends[: len(PHASES)] == [PHASE_TITLES[p] for p in PHASES]
    for name, target in zip(PHASES, targets, strict=False):
        assert f'phase="{name}"' in target["expr"]
        assert metric_names(target["expr"]) == {R.RANK_PHASE_SECONDS_MEAN.record}
    # The phases are exclusive: backward stacks as it is, with no wait to take out.
    backward = targets[PHASES.index("backward")]["expr"]
    assert "collective_wait" not in backward
    # The whole step is drawn too, outside the stack.
    step = targets[len(PHASES)]
    assert metric_names(step["expr"]) == {R.RANK_STEP_SECONDS_MEAN.record}
    (override,) = [
        o for o in panel["fieldConfig"]["overrides"] if "step" in o["matcher"]["options"]
    ]
    props = {p["id"]: p["value"] for p in override["properties"]}
    assert props["custom.stacking"]["mode"] == "none"


def test_job_view_panels(boards: dict[str, dict[str, Any]]) -> None:
    board = boards["auditor-job"]
    wanted = {
        "Batch size per rank": {C.RANK_BATCH_SIZE.name},
        "GPU busy per GPU": {C.GPU_UTILIZATION_RATIO.name},
        "GPU memory used / total per GPU": {
            C.GPU_MEMORY_USED_BYTES.name,
            C.GPU_MEMORY_TOTAL_BYTES.name,
        },
        "Rank CPU cores (main process / DataLoader workers)": {C.RANK_CPU_CORES.name},
        "DataLoader workers (alive / configured)": {
            C.RANK_DATALOADER_WORKERS.name,
            C.RANK_DATALOADER_CONFIG_WORKERS.name,
        },
        "Current findings": {C.FINDING.name, C.FINDING_PREDICTED_SPEEDUP.name},
        "Job MFU": {C.JOB_MFU_RATIO.name},
        "MFU per rank": {C.RANK_MFU_RATIO.name},
        "Achieved FLOP/s per rank": {C.RANK_FLOPS_PER_SECOND.name},
        "FLOPs per step per rank": {C.RANK_FLOPS_PER_STEP.name},
    }
    for title, names in wanted.items():
        panel = by_title(board, title)
        assert set().union(*(metric_names(e) for e in exprs(panel))) == names, title
        for e in exprs(panel):
            assert JOB in e, (title, e)
    # MFU is a share of the peak; a value that was not measured is said to be missing.
    for title in ("Job MFU", "MFU per rank"):
        panel = by_title(board, title)
        assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit", title
        assert "not measured" in panel["description"], title
    assert by_title(board, "Achieved FLOP/s per rank")["fieldConfig"]["defaults"]["unit"] == "flops"
    # The per-rank breakdown table: every phase of the selected ranks.
    table = by_title(board, "Step breakdown by rank (seconds per step, 1 m mean)")
    assert exprs(table) == [phase_breakdown(JOB, RANK)]


def test_node_view_panels(boards: dict[str, dict[str, Any]]) -> None:
    board = boards["auditor-node"]
    wanted = {
        "GPU busy": {C.GPU_UTILIZATION_RATIO.name},
        "GPU memory used and installed": {
            C.GPU_MEMORY_USED_BYTES.name,
            C.GPU_MEMORY_TOTAL_BYTES.name,
        },
        "Clocks vs maximum (SM and memory)": {
            C.GPU_SM_CLOCK_HERTZ.name,
            C.GPU_SM_CLOCK_MAX_HERTZ.name,
            C.GPU_MEMORY_CLOCK_HERTZ.name,
            C.GPU_MEMORY_CLOCK_MAX_HERTZ.name,
        },
        "Power draw vs limit": {C.GPU_POWER_WATTS.name, C.GPU_POWER_LIMIT_WATTS.name},
        "Temperature": {C.GPU_TEMPERATURE_CELSIUS.name},
        "Throttle reasons active": {C.GPU_THROTTLE_ACTIVE.name},
        "CPU cores: available vs busy": {C.NODE_CPU_CORES.name, C.NODE_CPU_BUSY_CORES.name},
        "Load average (1 m) vs cores": {C.NODE_LOAD1.name, C.NODE_CPU_CORES.name},
        "DataLoader workers per rank": {C.RANK_DATALOADER_WORKERS.name},
        "DataLoader worker CPU cores per rank": {C.RANK_CPU_CORES.name},
        "Achieved work per job (what the underused alert judges)": {R.NODE_JOB_ACHIEVED_AVG.record},
        "MFU per rank": {C.RANK_MFU_RATIO.name},
        "Tensor pipe and SM activity (DCGM)": {
            C.GPU_TENSOR_PIPE_ACTIVE_RATIO.name,
            C.GPU_SM_ACTIVE_RATIO.name,
        },
    }
    for title, names in wanted.items():
        panel = by_title(board, title)
        assert set().union(*(metric_names(e) for e in exprs(panel))) == names, title
        for e in exprs(panel):
            assert 'node=~"$node"' in e, (title, e)
    assert 'process="workers"' in exprs(by_title(board, "DataLoader worker CPU cores per rank"))[0]
    # The alert's series, its measure in the legend: which measure judged each job is on view.
    achieved = by_title(board, "Achieved work per job (what the underused alert judges)")
    assert achieved["targets"][0]["legendFormat"] == "{{auditor_job}} ({{measure}})"


# --- the model itself ----------------------------------------------------------------------------


def test_layout_wraps_rows_at_24_columns() -> None:
    wide = tuple(TimeSeries(title=f"p{i}", w=10, targets=(Target(expr="up"),)) for i in range(3))
    board = Dashboard(uid="u", title="t", rows=(Row(title="r", panels=wide),))
    grid = [(type(item).__name__, pos.x, pos.y) for item, pos in board.layout()]
    assert grid == [
        ("Row", 0, 0),
        ("TimeSeries", 0, 1),
        ("TimeSeries", 10, 1),
        ("TimeSeries", 0, 9),
    ]
    with pytest.raises(ValueError, match="width"):
        TimeSeries(title="too wide", w=25)


def test_collapsed_rows_hold_their_panels() -> None:
    panel = TimeSeries(title="inner", targets=(Target(expr="up"),))
    board = Dashboard(uid="u", title="t", rows=(Row(title="r", panels=(panel,), collapsed=True),))
    rendered = board.to_dict()
    assert [p["type"] for p in rendered["panels"]] == ["row"]
    assert queries(rendered) == [("inner", "up")]


# --- substitution, and every query parsed by promtool ---------------------------------------------


@pytest.mark.parametrize(
    ("expr", "values", "expected"),
    [
        ('a{job=~"$job"}', {"job": "All"}, 'a{job=~".*"}'),
        ('a{job=~"$job"}', {"job": "$__all"}, 'a{job=~".*"}'),
        ('a{job=~"$job"}', {"job": ["x", "y"]}, 'a{job=~"(x|y)"}'),
        ('a{job=~"${job}"}', {"job": "train.v2"}, 'a{job=~"train\\\\.v2"}'),
        ('a{job=~"${job:raw}"}', {"job": "a.b"}, 'a{job=~"a.b"}'),
        ('a{rank=~"$rank|"}', {"rank": "3"}, 'a{rank=~"3|"}'),
        ("rate(a[$__rate_interval])", {}, "rate(a[1m])"),
        ("rate(a[$__rate_interval])", {"__rate_interval": "2m"}, "rate(a[2m])"),
        ('a{x=~"[[job]]"}', {"job": "j"}, 'a{x=~"j"}'),
    ],
)
def test_substitute(expr: str, values: Mapping[str, str | Sequence[str]], expected: str) -> None:
    assert substitute(expr, values) == expected


def test_substitute_refuses_a_variable_without_a_value() -> None:
    with pytest.raises(ValueError, match=r"\$node"):
        substitute('a{node=~"$node"}', {"job": "x"})


VALUE_SETS: list[dict[str, str | list[str]]] = [
    {"job": "All", "node": "All", "rank": "All"},
    {"job": "train", "node": "gpu-node-1", "rank": "0"},
    {"job": ["a.b", "c(d)"], "node": ["10.0.0.1", "n|2"], "rank": ["1", "12"]},
]


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    """promtool parses every query (and every variable's selector) after substitution."""
    counter = itertools.count()
    rules = []
    for uid, board in rendered().items():
        pairs = [*queries(board), *variable_selectors(board)]
        for (_, expr), values in itertools.product(pairs, VALUE_SETS):
            rules.append({"record": f"check:q{next(counter)}", "expr": substitute(expr, values)})
            assert "$" not in rules[-1]["expr"], (uid, expr)
    assert rules, "no query to parse"
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    proc = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def test_breakdown_queries_evaluate_as_intended(tmp_path: Path) -> None:
    """On real series through the real recording rules: the phases are exclusive, so backward
    is the backward series as it is (no wait taken out), and the table query gives every phase
    of the job's ranks, one row per rank and phase."""
    rules = tmp_path / "rules.yml"
    rules.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "rec", "rules": [r.to_dict() for r in R.RECORDING_RULES]}]}
        )
    )
    r0 = {"auditor_job": "j", "node": "n1", "rank": "0", "local_rank": "0"}
    r1 = {"auditor_job": "j", "node": "n1", "rank": "1", "local_rank": "1"}
    # One step per 15 s scrape; seconds per step: backward 0.5, then 0.25 of collective wait.
    series = [
        (C.RANK_STEPS_TOTAL.name, r0, "0+1x40"),
        (C.RANK_PHASE_SECONDS_TOTAL.name, {**r0, "phase": "backward"}, "0+0.5x40"),
        (C.RANK_PHASE_SECONDS_TOTAL.name, {**r0, "phase": "collective_wait"}, "0+0.25x40"),
        (C.RANK_PHASE_SECONDS_TOTAL.name, {**r0, "phase": "forward"}, "0+0.25x40"),
        (C.RANK_STEPS_TOTAL.name, r1, "0+1x40"),
        (C.RANK_PHASE_SECONDS_TOTAL.name, {**r1, "phase": "backward"}, "0+0.5x40"),
        # Another job: the job filter keeps it out.
        (C.RANK_STEPS_TOTAL.name, {**r0, "auditor_job": "other"}, "0+1x40"),
        (
            C.RANK_PHASE_SECONDS_TOTAL.name,
            {**r0, "auditor_job": "other", "phase": "backward"},
            "0+1x40",
        ),
    ]
    mean = R.RANK_PHASE_SECONDS_MEAN.record
    values = {"job": "j", "rank": "All"}
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": name + _labels(**labels), "values": v} for name, labels, v in series
                ],
                "promql_expr_test": [
                    {
                        "expr": substitute(phase("backward", JOB, RANK), values),
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": mean + _labels(**r0, phase="backward"), "value": 0.5},
                            {"labels": mean + _labels(**r1, phase="backward"), "value": 0.5},
                        ],
                    },
                    {
                        "expr": substitute(phase_breakdown(JOB, RANK), values),
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": mean + _labels(**r0, phase="backward"), "value": 0.5},
                            {"labels": mean + _labels(**r0, phase="forward"), "value": 0.25},
                            {
                                "labels": mean + _labels(**r0, phase="collective_wait"),
                                "value": 0.25,
                            },
                            {
                                "labels": mean + _labels(**r1, phase="backward"),
                                "value": 0.5,
                            },
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "breakdown.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_findings_table_queries_join_on_job_kind_rank(tmp_path: Path) -> None:
    """The speed-up column only has rows for findings the table shows (node filter included)."""
    board = rendered()["auditor-node"]
    finding, speedup = exprs(by_title(board, "Current findings"))
    values = {"job": "All", "node": "n1"}
    series = [
        (
            C.FINDING.name,
            {
                "auditor_job": "j",
                "kind": "data_starvation",
                "rank": "1",
                "node": "n1",
                "severity": "warning",
            },
        ),
        (
            C.FINDING.name,
            {
                "auditor_job": "j",
                "kind": "compute_straggler",
                "rank": "2",
                "node": "n2",
                "severity": "critical",
            },
        ),
        (
            C.FINDING_PREDICTED_SPEEDUP.name,
            {"auditor_job": "j", "kind": "data_starvation", "rank": "1"},
        ),
        (
            C.FINDING_PREDICTED_SPEEDUP.name,
            {"auditor_job": "j", "kind": "compute_straggler", "rank": "2"},
        ),
    ]
    tests = {
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": name + _labels(**labels), "values": "1.5x10"}
                    for name, labels in series
                ],
                "promql_expr_test": [
                    {
                        "expr": substitute(finding, values),
                        "eval_time": "1m",
                        "exp_samples": [{"labels": _labels(**series[0][1]), "value": 1.5}],
                    },
                    {
                        "expr": substitute(speedup, values),
                        "eval_time": "1m",
                        "exp_samples": [{"labels": _labels(**series[2][1]), "value": 1.5}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "findings.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Label values for a small, complete cluster: one job "j" with two ranks on node "n1", each rank
# owning one GPU, and a finding against rank 1.
_LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "auditor_job": ("j",),
    "node": ("n1",),
    "device": ("cuda",),
    "parallel_mode": ("ddp",),
    "world_size": ("2",),
    "model": ("H100",),
    "pin_memory": ("true",),
    "persistent_workers": ("false",),
    "prefetch_factor": ("2",),
    "batch_size": ("32",),
    "kind": ("data_starvation",),
    "severity": ("warning",),
    "reason": ("hw_slowdown",),
    "current": ("0",),
    "proposed": ("7",),
    "fix": ("num_workers 0 -> 7, pin_memory=True; expect about 4.6x",),
}


def _complete_series() -> list[dict[str, str]]:
    """Input series for every catalog metric, with every bounded label value it can take."""
    out = []
    for spec in C.CATALOG:
        values = "0+1x40" if spec.type == "counter" else "1x40"
        free = [
            label for label in spec.labels if label not in ("rank", "local_rank", "gpu", "uuid")
        ]
        owner_labels = {"rank", "local_rank", "gpu", "uuid"} & set(spec.labels)
        owners = ("0", "1") if owner_labels else ("",)
        choices = [C.LABEL_VALUES.get(label) or _LABEL_VALUES[label] for label in free]
        for owner in owners:
            for combo in itertools.product(*choices):
                labels = dict(zip(free, combo, strict=True))
                for label in owner_labels:
                    labels[label] = f"GPU-{owner}" if label == "uuid" else owner
                out.append({"series": spec.name + _labels(**labels), "values": values})
    return out


def test_every_query_returns_data_on_a_complete_cluster(tmp_path: Path) -> None:
    """With every metric present, no panel is empty: labels, joins and filters line up with
    what the exporter and the recording rules produce."""
    rules = tmp_path / "rules.yml"
    rules.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "rec", "rules": [r.to_dict() for r in R.RECORDING_RULES]}]}
        )
    )
    checks = []
    for board in rendered().values():
        for (_, expr), values in itertools.product(
            queries(board),
            [{"job": "All", "node": "All", "rank": "All"}, {"job": "j", "node": "n1", "rank": "1"}],
        ):
            checks.append(
                {
                    # 1 when the query has at least one series, nothing (a mismatch) when empty.
                    "expr": f"count({substitute(expr, values)}) > bool 0",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": "{}", "value": 1}],
                }
            )
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [
            {"interval": "15s", "input_series": _complete_series(), "promql_expr_test": checks}
        ],
    }
    path = tmp_path / "complete.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]


def test_every_board_has_the_fixes_table_and_no_link_to_a_port(
    boards: dict[str, dict[str, Any]],
) -> None:
    """What to change on which rank is read from Prometheus on every board, beside the findings;
    nothing points at auditor serve's own port, which the documented SSH tunnel and KubeRay's
    ClusterIP service do not reach."""
    for uid, board in boards.items():
        table = by_title(board, "What to change, per rank")
        assert table["type"] == "table", uid
        (fix,) = exprs(table)
        assert metric_names(fix) == {C.FINDING_FIX_INFO.name}
        assert fix.startswith("max by (auditor_job, kind, rank, node, fix) (")
        names = {o["matcher"]["options"]: o for o in table["fieldConfig"]["overrides"]}
        assert {"id": "displayName", "value": "what to change"} in names["fix"]["properties"]
        text = json.dumps(board)
        for dead in ("9410", "serve_url", "/api/v1/"):
            assert dead not in text, (uid, dead)
