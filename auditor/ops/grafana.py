"""A small typed model of Grafana's dashboard JSON (schemaVersion 39). Reading a rendered
dashboard's queries back out, for checking against a real Prometheus, is
:mod:`auditor.ops.dashboard_queries`.

Panels are laid out by :class:`Dashboard` itself: rows stack vertically, panels flow left to right
and wrap at Grafana's 24 columns, so no builder hand-computes a ``gridPos``. Panel ids and target
refIds are assigned at render time in declaration order, which keeps the JSON deterministic.

Every panel with queries uses the ``${datasource}`` variable, so the same JSON works on any
Grafana whose Prometheus data source holds the auditor's series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

SCHEMA_VERSION = 39
GRID_COLUMNS = 24
DATASOURCE_VAR = "datasource"
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}

Json = dict[str, Any]


@dataclass(frozen=True)
class GridPos:
    """A panel's place on Grafana's grid: 24 columns wide, heights in rows of 30 px."""

    x: int
    y: int
    w: int
    h: int

    def to_dict(self) -> Json:
        return {"h": self.h, "w": self.w, "x": self.x, "y": self.y}


@dataclass(frozen=True, kw_only=True)
class Target:
    """One Prometheus query of a panel. ``ref_id`` empty: assigned A, B, ... by the panel."""

    expr: str
    legend_format: str = ""
    instant: bool = False
    format: Literal["time_series", "table", "heatmap"] = "time_series"
    ref_id: str = ""

    def to_dict(self, ref_id: str) -> Json:
        return {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "legendFormat": self.legend_format or "__auto",
            "range": not self.instant,
            "refId": self.ref_id or ref_id,
        }


@dataclass(frozen=True)
class Threshold:
    """A threshold step: from ``value`` upwards (None: the base step) the colour is ``color``."""

    value: float | None
    color: str

    def to_dict(self) -> Json:
        return {"color": self.color, "value": self.value}


def _ref_ids() -> list[str]:
    return [chr(ord("A") + i) for i in range(26)]


@dataclass(frozen=True, kw_only=True)
class Panel:
    """What every panel type shares; the subclasses add their ``options`` and custom config.

    ``w``/``h`` are the size on the grid; the dashboard computes the position. ``repeat`` names a
    variable to repeat the panel for (one copy per selected value).
    """

    type: ClassVar[str] = ""

    title: str
    targets: tuple[Target, ...] = ()
    description: str = ""
    w: int = 12
    h: int = 8
    unit: str = ""
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    no_value: str = ""
    thresholds: tuple[Threshold, ...] = ()
    mappings: tuple[Json, ...] = ()
    overrides: tuple[Json, ...] = ()
    transformations: tuple[Json, ...] = ()
    links: tuple[Json, ...] = ()
    repeat: str | None = None
    max_per_row: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.w <= GRID_COLUMNS:
            raise ValueError(f"panel {self.title!r}: width {self.w} outside 1..{GRID_COLUMNS}")
        if len(self.targets) > 26:
            raise ValueError(f"panel {self.title!r}: more than 26 targets")

    def custom(self) -> Json:
        """``fieldConfig.defaults.custom``: the panel type's own field options."""
        return {}

    def options(self) -> Json:
        return {}

    def color(self) -> Json:
        return {"mode": "thresholds"} if self.thresholds else {"mode": "palette-classic"}

    def field_defaults(self) -> Json:
        defaults: Json = {
            "color": self.color(),
            "custom": self.custom(),
            "mappings": [dict(m) for m in self.mappings],
        }
        if self.unit:
            defaults["unit"] = self.unit
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        if self.decimals is not None:
            defaults["decimals"] = self.decimals
        if self.no_value:
            defaults["noValue"] = self.no_value
        steps = self.thresholds or (Threshold(None, "green"),)
        defaults["thresholds"] = {"mode": "absolute", "steps": [s.to_dict() for s in steps]}
        return defaults

    def to_dict(self, panel_id: int, grid: GridPos) -> Json:
        ids = _ref_ids()
        out: Json = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "gridPos": grid.to_dict(),
        }
        if self.targets:
            out["datasource"] = dict(DATASOURCE)
            out["targets"] = [t.to_dict(ids[i]) for i, t in enumerate(self.targets)]
        out["fieldConfig"] = {
            "defaults": self.field_defaults(),
            "overrides": [dict(o) for o in self.overrides],
        }
        out["options"] = self.options()
        if self.transformations:
            out["transformations"] = [dict(t) for t in self.transformations]
        if self.links:
            out["links"] = [dict(link) for link in self.links]
        if self.repeat:
            out["repeat"] = self.repeat
            out["repeatDirection"] = "h"
            out["maxPerRow"] = self.max_per_row
        return out


@dataclass(frozen=True, kw_only=True)
class TimeSeries(Panel):
    """A time series graph; ``stack`` stacks every series (for parts that sum to a whole)."""

    type: ClassVar[str] = "timeseries"

    stack: bool = False
    fill: int = 10
    draw_style: Literal["line", "bars", "points"] = "line"
    legend_calcs: tuple[str, ...] = ("lastNotNull", "max")
    legend_placement: Literal["bottom", "right"] = "bottom"

    def custom(self) -> Json:
        return {
            "axisBorderShow": False,
            "axisPlacement": "auto",
            "drawStyle": self.draw_style,
            "fillOpacity": self.fill,
            "gradientMode": "none",
            "lineInterpolation": "linear",
            "lineWidth": 1,
            "pointSize": 4,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if self.stack else "none"},
        }

    def options(self) -> Json:
        return {
            "legend": {
                "calcs": list(self.legend_calcs),
                "displayMode": "table",
                "placement": self.legend_placement,
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        }


@dataclass(frozen=True, kw_only=True)
class Heatmap(Panel):
    """A heatmap whose rows are the query's series as they come (``calculate`` off): one row per
    series, named by its legend, coloured by value."""

    type: ClassVar[str] = "heatmap"

    scheme: str = "RdYlGn"
    color_min: float | None = None
    color_max: float | None = None

    def custom(self) -> Json:
        return {
            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
            "scaleDistribution": {"type": "linear"},
        }

    def options(self) -> Json:
        color: Json = {
            "exponent": 0.5,
            "fill": "dark-orange",
            "mode": "scheme",
            "reverse": False,
            "scale": "linear",
            "scheme": self.scheme,
            "steps": 64,
        }
        if self.color_min is not None:
            color["min"] = self.color_min
        if self.color_max is not None:
            color["max"] = self.color_max
        return {
            "calculate": False,
            "cellGap": 1,
            "cellValues": {"unit": self.unit} if self.unit else {},
            "color": color,
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            # Grafana hides cells <= 1e-9 by default: an idle GPU (exactly 0) must still show.
            "filterValues": {"le": -1},
            "legend": {"show": True},
            # Series names ("node-1 gpu 0") are labels, not bucket bounds.
            "rowsFrame": {"layout": "unknown"},
            "showValue": "never",
            "tooltip": {
                "mode": "single",
                "show": True,
                "showColorScale": True,
                "yHistogram": False,
            },
            "yAxis": {"axisPlacement": "left", "reverse": True},
        }


@dataclass(frozen=True, kw_only=True)
class Table(Panel):
    """A table, normally of instant queries with ``format="table"`` joined by transformations."""

    type: ClassVar[str] = "table"

    sort_by: str | None = None
    sort_desc: bool = True

    def custom(self) -> Json:
        return {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False}

    def options(self) -> Json:
        out: Json = {
            "cellHeight": "sm",
            "footer": {"countRows": False, "fields": "", "reducer": ["sum"], "show": False},
            "showHeader": True,
        }
        if self.sort_by:
            out["sortBy"] = [{"desc": self.sort_desc, "displayName": self.sort_by}]
        return out


@dataclass(frozen=True, kw_only=True)
class Stat(Panel):
    """A single big number per series (the latest value)."""

    type: ClassVar[str] = "stat"

    graph: bool = False
    color_mode: Literal["value", "background", "none"] = "value"

    def options(self) -> Json:
        return {
            "colorMode": self.color_mode,
            "graphMode": "area" if self.graph else "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        }


@dataclass(frozen=True, kw_only=True)
class Text(Panel):
    """Markdown text; Grafana interpolates dashboard variables (``${job}``) in it."""

    type: ClassVar[str] = "text"

    content: str = ""

    def options(self) -> Json:
        return {
            "code": {"language": "plaintext", "showLineNumbers": False, "showMiniMap": False},
            "content": self.content,
            "mode": "markdown",
        }


@dataclass(frozen=True, kw_only=True)
class Row:
    """A titled row; its panels follow it on the grid."""

    title: str
    panels: tuple[Panel, ...]
    collapsed: bool = False


# --- template variables -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DatasourceVariable:
    """The data source picker every panel refers to as ``${datasource}``."""

    name: str = DATASOURCE_VAR
    label: str = "Prometheus"
    plugin: str = "prometheus"
    # The data source picked first (the provisioned one); Grafana falls back to the default
    # Prometheus where no data source has this uid.
    default_uid: str = ""

    def to_dict(self) -> Json:
        current: Json = (
            {"selected": True, "text": self.default_uid, "value": self.default_uid}
            if self.default_uid
            else {}
        )
        return {
            "current": current,
            "hide": 0,
            "includeAll": False,
            "label": self.label,
            "multi": False,
            "name": self.name,
            "options": [],
            "query": self.plugin,
            "refresh": 1,
            "regex": "",
            "skipUrlSync": False,
            "type": "datasource",
        }


@dataclass(frozen=True, kw_only=True)
class QueryVariable:
    """Values from the data source, e.g. ``label_values(auditor_rank_info, auditor_job)``.

    With ``include_all`` the All value is ``all_value`` (``.*``), so queries match with
    ``label=~"$name"`` whichever way the variable is set.
    """

    name: str
    label: str
    query: str
    multi: bool = True
    include_all: bool = True
    all_value: str = ".*"
    sort: int = 1  # 1: alphabetical, 3: numerical (rank numbers)

    def to_dict(self) -> Json:
        current: Json = (
            {"selected": True, "text": ["All"], "value": ["$__all"]} if self.include_all else {}
        )
        return {
            "allValue": self.all_value if self.include_all else None,
            "current": current,
            "datasource": dict(DATASOURCE),
            "definition": self.query,
            "hide": 0,
            "includeAll": self.include_all,
            "label": self.label,
            "multi": self.multi,
            "name": self.name,
            "options": [],
            "query": {"query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            # 2: on time range change, so new jobs and ranks appear without a reload.
            "refresh": 2,
            "regex": "",
            "skipUrlSync": False,
            "sort": self.sort,
            "type": "query",
        }


@dataclass(frozen=True, kw_only=True)
class TextboxVariable:
    """A free-text variable with a default (e.g. the ``auditor serve`` address)."""

    name: str
    label: str
    default: str

    def to_dict(self) -> Json:
        value = {"selected": False, "text": self.default, "value": self.default}
        return {
            "current": value,
            "hide": 0,
            "label": self.label,
            "name": self.name,
            "options": [{"selected": True, "text": self.default, "value": self.default}],
            "query": self.default,
            "skipUrlSync": False,
            "type": "textbox",
        }


Variable = DatasourceVariable | QueryVariable | TextboxVariable


@dataclass(frozen=True, kw_only=True)
class Link:
    """A dashboard link: to a URL (``url``), or to every dashboard carrying ``tags``."""

    title: str
    url: str = ""
    tags: tuple[str, ...] = ()
    include_vars: bool = False
    keep_time: bool = False
    tooltip: str = ""

    def to_dict(self) -> Json:
        return {
            "asDropdown": False,
            "icon": "external link" if self.url else "dashboard",
            "includeVars": self.include_vars,
            "keepTime": self.keep_time,
            "tags": list(self.tags),
            "targetBlank": bool(self.url),
            "title": self.title,
            "tooltip": self.tooltip,
            "type": "link" if self.url else "dashboards",
            "url": self.url,
        }


@dataclass(frozen=True, kw_only=True)
class Dashboard:
    """A whole dashboard; :meth:`to_dict` lays the rows out and numbers panels and targets."""

    uid: str
    title: str
    description: str = ""
    tags: tuple[str, ...] = ()
    rows: tuple[Row, ...] = ()
    variables: tuple[Variable, ...] = ()
    links: tuple[Link, ...] = ()
    time_from: str = "now-1h"
    refresh: str = "30s"

    def layout(self) -> list[tuple[Row | Panel, GridPos]]:
        """Every row and panel with its grid position, in order."""
        placed: list[tuple[Row | Panel, GridPos]] = []
        y = 0
        for row in self.rows:
            placed.append((row, GridPos(0, y, GRID_COLUMNS, 1)))
            y += 1
            x, line_h = 0, 0
            for panel in row.panels:
                if x + panel.w > GRID_COLUMNS:
                    x, y, line_h = 0, y + line_h, 0
                placed.append((panel, GridPos(x, y, panel.w, panel.h)))
                x += panel.w
                line_h = max(line_h, panel.h)
            y += line_h
        return placed

    def to_dict(self) -> Json:
        panels: list[Json] = []
        current_row: Json | None = None
        for panel_id, (item, grid) in enumerate(self.layout(), start=1):
            if isinstance(item, Row):
                current_row = {
                    "collapsed": item.collapsed,
                    "gridPos": grid.to_dict(),
                    "id": panel_id,
                    "panels": [],
                    "title": item.title,
                    "type": "row",
                }
                panels.append(current_row)
                continue
            rendered = item.to_dict(panel_id, grid)
            # A collapsed row holds its panels; an open row is followed by them.
            if current_row is not None and current_row["collapsed"]:
                current_row["panels"].append(rendered)
            else:
                panels.append(rendered)
        return {
            "annotations": {
                "list": [
                    {
                        "builtIn": 1,
                        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                        "enable": True,
                        "hide": True,
                        "iconColor": "rgba(0, 211, 255, 1)",
                        "name": "Annotations & Alerts",
                        "type": "dashboard",
                    }
                ]
            },
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,
            "id": None,
            "links": [link.to_dict() for link in self.links],
            "panels": panels,
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": [v.to_dict() for v in self.variables]},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "browser",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            "weekStart": "",
        }
