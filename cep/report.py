"""`cep report`: a replay's events and alerts for one rule, drawn as timelines per key.

The output is one self-contained HTML file: per key, a PNG (base64, made with matplotlib's Agg
canvas — no display, no pyplot global state) with an overview of all the key's events and a
close-up per alert, and a table of those alerts. Reads the alerts file `cep replay` writes and
the event files it read; no Spark.

In a close-up: grey dots are the key's other events, coloured dots joined by a line are the
events of the alert (labelled with their pattern variable), ticks along the bottom are every
event (also those without a value, e.g. heartbeats), and a dashed red line marks the deadline of
an absence (`-> NOT x` at the end of the pattern: the alert says "nothing came until here").
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cep.compile import check_paths
from cep.compile.diagnostics import CompileErrors
from cep.errors import CepError
from cep.nfa import CompiledRule, StateKind
from cep.testing.times import format_offset

_EPOCH_DAYS = 0.0  # matplotlib's date epoch is 1970-01-01 unless a user changes it (checked below)
MAX_CLOSEUPS = 6  # per key; the table still lists every alert
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#bcbd22")
EVENT_SUFFIXES = (".jsonl", ".json", ".ndjson")


class ReportError(CepError):
    pass


@dataclass(frozen=True, slots=True)
class KeyView:
    key: str
    events: list[dict[str, Any]]  # the key's events, in time order
    alerts: list[dict[str, Any]]  # the rule's alerts for the key, in time order


# -- inputs -----------------------------------------------------------------------------------
def load_rule(rules: str | Path, rule_id: str) -> CompiledRule:
    sets, errors = check_paths([rules])
    if errors:
        raise CompileErrors(errors)
    for rs in sets.values():
        for r in rs:
            if r.id == rule_id:
                return r
    known = ", ".join(r.id for rs in sets.values() for r in rs) or "none"
    raise ReportError(f"no rule {rule_id!r} in {rules} (rules: {known})")


def read_jsonl(paths: Iterable[Path], skipped: list[str] | None = None,
               ) -> Iterable[dict[str, Any]]:
    """JSON objects, one per line. With `skipped`, a line that is not a valid event (by the one
    definition, `cep.events`) is listed there as `file:line: reason` and passed over, as
    `cep replay` dead-letters it; without, it is an error (our own files: the alerts)."""
    from cep.events import parse_object

    for path in paths:
        with path.open("rb") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                record, reason = parse_object(line.rstrip(b"\r\n"))
                if record is None:
                    if skipped is None:
                        raise ReportError(f"{path}:{n}: not a JSON line ({reason})")
                    skipped.append(f"{path}:{n}: {reason}")
                    continue
                yield record


def event_files(inputs: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, inputs):
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.suffix in EVENT_SUFFIXES
                                and f.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise ReportError(f"{p}: no such file or directory")
    if not files:
        raise ReportError(f"no event files (*.jsonl) in {', '.join(map(str, inputs))}")
    return files


def select_keys(rule: CompiledRule, alerts: list[dict[str, Any]],
                events: Iterable[dict[str, Any]], n_keys: int,
                only: Sequence[str] = ()) -> list[KeyView]:
    """The keys to draw: `only` if given, else the `n_keys` keys with the most alerts."""
    counts = Counter(str(a["key"]) for a in alerts)
    first: dict[str, int] = {}
    for a in sorted(alerts, key=lambda a: int(a["first_ts"])):
        first.setdefault(str(a["key"]), int(a["first_ts"]))
    if only:
        keys = [str(k) for k in only]
    else:
        keys = sorted(counts, key=lambda k: (-counts[k], first[k], k))[:n_keys]
    wanted = set(keys)
    kf, tf = rule.key_field or "", rule.stream.time_field
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        k = ev.get(kf)
        if k is not None and str(k) in wanted and isinstance(ev.get(tf), int | float):
            by_key[str(k)].append(ev)
    out = []
    for k in keys:
        evs = sorted(by_key.get(k, []), key=lambda e: e[tf])
        als = sorted((a for a in alerts if str(a["key"]) == k),
                     key=lambda a: (int(a["first_ts"]), int(a["last_ts"])))
        out.append(KeyView(k, evs, als))
    return out


# -- drawing ----------------------------------------------------------------------------------
def deadline(rule: CompiledRule, alert: dict[str, Any]) -> int | None:
    """For a rule ending in an absence, when the absence was decided; else None."""
    if not any(s.kind is StateKind.ABSENCE for s in rule.nfa.states):
        return None
    ends = []
    if rule.nfa.within_ms is not None:
        ends.append(int(alert["first_ts"]) + rule.nfa.within_ms)
    if rule.nfa.step_ms is not None:
        ends.append(int(alert["last_ts"]) + rule.nfa.step_ms)
    return min(ends) if ends else None


def value_field(rule: CompiledRule, requested: str | None) -> str | None:
    if requested is not None:
        return None if requested.lower() == "none" else requested
    for f in rule.stream.fields or ():
        if f.type == "FLOAT" and f.name != rule.stream.time_field:
            return f.name
    return None


def _when(ms: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _x(ms: float) -> float:
    """Event time (epoch ms) as a matplotlib date number: days since 1970-01-01 UTC."""
    return ms / 86_400_000 + _EPOCH_DAYS


def _iso(ms: int) -> str:
    return _when(ms).strftime("%Y-%m-%d %H:%M:%S") + f".{ms % 1000:03d}Z"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def draw_key(rule: CompiledRule, view: KeyView, value: str | None) -> bytes:
    """One PNG: an overview row with every event of the key, and close-ups of its alerts."""
    from matplotlib import dates as mdates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if mdates.get_epoch() != "1970-01-01T00:00:00":
        raise ReportError(f"matplotlib's date epoch is {mdates.get_epoch()}, not 1970-01-01")

    tf = rule.stream.time_field
    shown = view.alerts[:MAX_CLOSEUPS]
    cols = min(3, max(1, len(shown)))
    rows = -(-len(shown) // cols) if shown else 0
    fig = Figure(figsize=(12, 1.9 + 3.2 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1 + rows, cols, height_ratios=[0.55] + [1.0] * rows)
    utc = dt.UTC

    # Overview: every event a tick, every alert a coloured band from first event to the end.
    ax = fig.add_subplot(grid[0, :])
    times = [_x(e[tf]) for e in view.events]
    ax.vlines(times, 0.15, 0.85, color="#888888", linewidth=0.8)
    for i, a in enumerate(view.alerts):
        color = COLORS[i % len(COLORS)]
        end = deadline(rule, a) or int(a["last_ts"])
        ax.axvspan(_x(int(a["first_ts"])), _x(max(end, int(a["first_ts"]) + 1)),
                   color=color, alpha=0.35, linewidth=0)
        ax.vlines([_x(int(ev["ts"])) for ev in a["events"]], 0.05, 0.95, color=color,
                  linewidth=1.6)
        ax.annotate(f"#{i + 1}", (_x(int(a["first_ts"])), 1.0),
                    xycoords=("data", "axes fraction"), xytext=(0, 1),
                    textcoords="offset points", color=color, fontsize=8, ha="center",
                    va="bottom", fontweight="bold")
    ax.set_yticks([])
    ax.set_ylim(0, 1)
    if times:
        lo, hi = min(times), max(times)
        pad = max((hi - lo) * 0.02, _x(30_000) - _x(0))
        ax.set_xlim(lo - pad, hi + pad)
    locator = mdates.AutoDateLocator(tz=utc)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=utc))
    ax.set_title(f"{rule.key_field} = {view.key}: {len(view.events)} events, "
                 f"{len(view.alerts)} alert{'s' if len(view.alerts) != 1 else ''} (UTC)",
                 loc="left", fontsize=10, pad=14)  # room for the #n labels above the axes
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)

    for i, a in enumerate(shown):
        _closeup(fig.add_subplot(grid[1 + i // cols, i % cols]), rule, view, a, i, value)

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _closeup(ax: Any, rule: CompiledRule, view: KeyView, alert: dict[str, Any], i: int,
             value: str | None) -> None:
    from matplotlib import dates as mdates
    from matplotlib.ticker import FuncFormatter

    tf = rule.stream.time_field
    color = COLORS[i % len(COLORS)]
    first, last = int(alert["first_ts"]), int(alert["last_ts"])
    end = deadline(rule, alert)
    right = max(last, end or last)
    pad = max((right - first) * 0.15, 5_000)
    lo, hi = first - pad, right + pad
    around = [e for e in view.events if lo <= e[tf] <= hi]
    matched = {(int(m["ts"]), json.dumps(m["event"], sort_keys=True)) for m in alert["events"]}

    def is_matched(e: dict[str, Any]) -> bool:
        return (int(e[tf]), json.dumps(e, sort_keys=True)) in matched

    # Every event as a tick along the bottom (those without a value too).
    ax.vlines([_x(e[tf]) for e in around], 0, 0.06, color="#999999", linewidth=1,
              transform=ax.get_xaxis_transform())
    ys = [_num(e.get(value)) for e in around] if value else []
    if value and any(y is not None for y in ys):
        others = [(_x(e[tf]), y) for e, y in zip(around, ys, strict=True)
                  if y is not None and not is_matched(e)]
        if others:
            ax.plot(*zip(*others, strict=True), "o", color="#bbbbbb", markersize=4, zorder=2)
        pts = [(_x(int(m["ts"])), _num(m["event"].get(value)), str(m["var"]))
               for m in alert["events"]]
        with_y = [(t, y, v) for t, y, v in pts if y is not None]
        if with_y:
            ax.plot([t for t, _, _ in with_y], [y for _, y, _ in with_y], "-o", color=color,
                    markersize=6, linewidth=1.5, zorder=3)
            for t, y, v in with_y:
                ax.annotate(f"{v} {y:g}", (t, y), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=7, color=color)
        for when, maybe, var in pts:
            if maybe is None:  # a matched event without a value: a tall tick, labelled
                ax.axvline(when, color=color, linewidth=1.5, ymax=0.25)
                ax.annotate(var, (when, 0.27), xycoords=("data", "axes fraction"),
                            ha="center", fontsize=7, color=color)
        ax.set_ylabel(value, fontsize=8)
        present = [y for y in ys if y is not None]
        if min(present) > 0 and max(present) / min(present) > 50:
            # Card testing: probes of 1.00 and a charge of 1,200 — on a linear axis the
            # probes sit on the floor.
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ymin, ymax = ax.get_ylim()
            ax.set_ylim(ymin / 3, ymax * 1.5)
        else:
            ymin, ymax = ax.get_ylim()
            ax.set_ylim(ymin - (ymax - ymin) * 0.12, ymax + (ymax - ymin) * 0.08)
    else:
        for m in alert["events"]:
            t = _x(int(m["ts"]))
            ax.axvline(t, color=color, linewidth=2, ymin=0.1, ymax=0.8)
            ax.annotate(str(m["var"]), (t, 0.83), xycoords=("data", "axes fraction"),
                        ha="center", fontsize=7, color=color)
        ax.set_yticks([])
    if end is not None:
        ax.axvline(_x(end), color="#d62728", linestyle="--", linewidth=1.3)
        ax.annotate("deadline", (_x(end), 0.97), xycoords=("data", "axes fraction"),
                    ha="right", va="top", fontsize=7, color="#d62728", rotation=90)
        ax.axvspan(_x(last), _x(end), color="#d62728", alpha=0.06, linewidth=0)
    ax.set_xlim(_x(lo), _x(hi))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=dt.UTC, minticks=3, maxticks=7))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=dt.UTC))
    ax.tick_params(labelsize=7)
    took = format_offset(last - first)
    head = f"#{i + 1} {alert['kind']}: {_when(first):%Y-%m-%d %H:%M:%S}"
    if end is None:
        head += f" → {_when(last):%H:%M:%S} ({took})"
    else:  # an absence: the last matched event, then nothing until the deadline
        if last != first:
            head += f" → {_when(last):%H:%M:%S}"
        head += f", then nothing until {_when(end):%H:%M:%S} ({format_offset(end - last)})"
    ax.set_title(head, fontsize=9, color=color, loc="left")
    for side in ("right", "top"):
        ax.spines[side].set_visible(False)


# -- page ---------------------------------------------------------------------------------------
CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1400px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.15em; margin-top: 2em; }
.meta { color: #555; } code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
table { border-collapse: collapse; margin: .6em 0 1em; font-size: 13px; }
th, td { border-bottom: 1px solid #e3e3e3; padding: .25em .7em; text-align: left;
         vertical-align: top; }
th { background: #fafafa; } td.id { font-family: ui-monospace, monospace; font-size: 12px; }
img { max-width: 100%; border: 1px solid #eee; }
.swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px;
          margin-right: .3em; vertical-align: -.05em; }
"""


def _alert_rows(view: KeyView) -> str:
    rows = []
    for i, a in enumerate(view.alerts):
        color = COLORS[i % len(COLORS)]
        vars_ = Counter(str(e["var"]) for e in a["events"])
        measures = ", ".join(f"{k}={json.dumps(v)}" for k, v in (a.get("measures") or {}).items())
        rows.append(
            "<tr>"
            f"<td><span class=swatch style='background:{color}'></span>#{i + 1}</td>"
            f"<td class=id>{html.escape(str(a['alert_id']))}</td>"
            f"<td>{html.escape(str(a['kind']))}</td>"
            f"<td>{_iso(int(a['first_ts']))}</td><td>{_iso(int(a['last_ts']))}</td>"
            f"<td>{html.escape(', '.join(f'{v}×{n}' for v, n in vars_.items()))}</td>"
            f"<td>{html.escape(measures)}</td></tr>")
    head = ("<tr><th></th><th>alert id</th><th>kind</th><th>first event</th><th>last event</th>"
            "<th>events</th><th>measures</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(rule: CompiledRule, views: list[KeyView], pngs: list[bytes], *,
                n_alerts: int, n_keys: int, source: str) -> str:
    title = f"{rule.id}: {rule.title}" if rule.title else rule.id
    within = f", WITHIN {rule.nfa.within_ms / 1000:g}s" if rule.nfa.within_ms else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)} — replay report</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class=meta>{html.escape(rule.description)}<br>PATTERN "
        f"<code>({html.escape(rule.nfa.pattern)})</code>{html.escape(within)}, "
        f"partitioned by <code>{html.escape(rule.key_field or '')}</code>. "
        f"{html.escape(source)}</p>",
        f"<p>{n_alerts} alert{'s' if n_alerts != 1 else ''} on {n_keys} "
        f"key{'s' if n_keys != 1 else ''}; showing {len(views)}.</p>",
    ]
    if not views:
        parts.append(f"<p><b>No alerts for rule {html.escape(rule.id)}.</b></p>")
    for view, png in zip(views, pngs, strict=True):
        parts.append(f"<h2 id='key-{html.escape(view.key)}'>{html.escape(rule.key_field or 'key')}"
                     f" = {html.escape(view.key)}</h2>")
        data = base64.b64encode(png).decode()
        parts.append(f"<img alt='timeline of {html.escape(view.key)}' "
                     f"src='data:image/png;base64,{data}'>")
        if len(view.alerts) > MAX_CLOSEUPS:
            parts.append(f"<p class=meta>Close-ups of the first {MAX_CLOSEUPS} alerts; the "
                         "overview and the table show all.</p>")
        if view.alerts:
            parts.append(_alert_rows(view))
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(*, alerts: str | Path, inputs: Sequence[str | Path], rule_id: str,
                 rules: str | Path = "rules", keys: int = 8, only_keys: Sequence[str] = (),
                 value: str | None = None, out: str | Path = "report.html",
                 png_dir: str | Path | None = None) -> Path:
    """Write the HTML report (and the PNGs into `png_dir` if given); returns the HTML path."""
    rule = load_rule(rules, rule_id)
    alerts_path = Path(alerts)
    if not alerts_path.is_file():
        raise ReportError(f"{alerts_path}: no such file")
    records = [a for a in read_jsonl([alerts_path]) if a.get("rule_id") == rule_id]
    skipped: list[str] = []
    views = select_keys(rule, records, read_jsonl(event_files(inputs), skipped), keys,
                        only_keys)
    field = value_field(rule, value)
    pngs = [draw_key(rule, v, field) for v in views]
    if png_dir is not None:
        folder = Path(png_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for i, (v, png) in enumerate(zip(views, pngs, strict=True)):
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in v.key)
            (folder / f"{rule_id}-{i + 1:02d}-{safe}.png").write_bytes(png)
    source = f"Alerts: {alerts_path}; events: {', '.join(map(str, inputs))}."
    if skipped:
        source += (f" {len(skipped)} line{'s' if len(skipped) != 1 else ''} that are not valid "
                   f"events skipped (replay dead-letters them), e.g. {skipped[0]}.")
    page = render_html(rule, views, pngs, n_alerts=len(records),
                       n_keys=len({str(a['key']) for a in records}), source=source)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
