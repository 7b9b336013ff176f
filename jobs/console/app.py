"""`cep console`: one web page for rule authors and on-call (docs/console.md).

Views: rules in force (status, errors with caret, automaton SVG, per-rule alert rate and live
partial matches from the job's metrics), live alerts from Redis (server-sent events) with a
timeline per alert, a playground on the embedded engine (pasted, uploaded, or picked from the
sample streams and replay inputs), saved searches (the saved-search API, mounted under
/search-api with its own API keys), and the live job's health from its metrics file.

Safe by default: the pages are static; every piece of user text (rules, events, errors, alert
fields) reaches the page as JSON and is put in the DOM with `textContent`, never as HTML. The
automaton SVG is Graphviz output (it escapes label text) shown through `<img>`, where scripts
never run. Every asset is served from `jobs/console/static`: nothing comes from a CDN.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from cep.compile import check_paths, rule_files
from cep.nfa import CompiledRule
from jobs.console import playground

STATIC = Path(__file__).resolve().parent / "static"
PAGES = ("rules", "alerts", "playground", "searches", "health")
ALERT_STREAMS = "cep:alerts:*"
ROOT = Path(__file__).resolve().parents[2]
# What the playground offers as input: the sample streams `cep demo` replays, and any replay
# input folder given to the console (`Console(inputs=...)`).
DEFAULT_INPUTS = (ROOT / "examples",)
INPUT_SUFFIXES = (".jsonl", ".ndjson", ".json")
MAX_INPUT_FILES = 500


class RunIn(BaseModel):
    rules: str = Field(max_length=playground.MAX_RULES_BYTES)
    events: str = Field(default="", max_length=playground.MAX_EVENTS_BYTES)
    stream: str | None = None


class SaveIn(RunIn):
    name: str = Field(default="playground case", max_length=200)
    rules_file: str = Field(default="../rules.cep", max_length=500)


class TimelineIn(BaseModel):
    alert: dict[str, Any]


class Console:
    """What the views read: the rules directory, the job's metrics file, Redis."""

    def __init__(self, rules_dir: str | Path, *, metrics: str | Path | None = None,
                 redis_url: str | None = None,
                 inputs: list[str | Path] | tuple[str | Path, ...] | None = None) -> None:
        self.rules_dir = Path(rules_dir)
        self.metrics = Path(metrics) if metrics else None
        self.redis_url = redis_url
        self.inputs = [Path(p) for p in (DEFAULT_INPUTS if inputs is None else inputs)]
        self._svg: dict[str, bytes] = {}

    def rules_file_text(self, name: str) -> str:
        """A rules file of the directory, by the name the Rules view lists (nothing else)."""
        files = rule_files([self.rules_dir]) if self.rules_dir.exists() else []
        for f in files:
            if str(f.relative_to(self.rules_dir)) == name:
                if f.stat().st_size > playground.MAX_RULES_BYTES:
                    raise HTTPException(413, f"{name} is larger than the playground's "
                                             f"{playground.MAX_RULES_BYTES // 1024} KiB")
                return f.read_text()
        raise HTTPException(404, f"no rules file {name!r}")

    # -- playground inputs ------------------------------------------------------------------
    def input_files(self) -> dict[str, dict[str, Any]]:
        """Files the playground may read, by id (`<folder name>/<path in it>`): JSON lines
        under the input folders. Only these ids are ever opened (no path from the client)."""
        out: dict[str, dict[str, Any]] = {}
        for folder in self.inputs:
            if folder.is_file():
                found, base = [folder], folder.parent
            elif folder.is_dir():
                found = sorted(p for p in folder.rglob("*") if p.is_file()
                               and p.suffix in INPUT_SUFFIXES
                               and not p.name.endswith(".expected.json")
                               and not any(part.startswith(".") for part in p.parts))
                base = folder
            else:
                continue
            for p in found[:MAX_INPUT_FILES]:
                rel = p.relative_to(base)
                ident = f"{base.name}/{rel.as_posix()}"
                # A replay's folder per stream (data/transactions/part-0.jsonl) or a file named
                # after its stream (examples/transactions.jsonl).
                stream = rel.parts[0] if len(rel.parts) > 1 else p.name.split(".")[0]
                out.setdefault(ident, {"id": ident, "path": p, "stream": stream,
                                       "bytes": p.stat().st_size})
        return out

    def read_input(self, ident: str, limit: int) -> dict[str, Any]:
        """The first `limit` events of an input file (at most the playground's limits)."""
        entry = self.input_files().get(ident)
        if entry is None:
            raise HTTPException(404, f"no input {ident!r}")
        limit = max(1, min(limit, playground.MAX_EVENTS))
        lines: list[str] = []
        size = 0
        truncated = False
        with entry["path"].open(encoding="utf-8", errors="replace") as fh:
            if entry["path"].suffix == ".json":  # one JSON array of events
                return self._read_array(entry, fh.read(playground.MAX_EVENTS_BYTES + 1), limit)
            for line in fh:
                if not line.strip():
                    continue
                if len(lines) >= limit or size + len(line.encode()) > playground.MAX_EVENTS_BYTES:
                    truncated = True
                    break
                lines.append(line.rstrip("\n"))
                size += len(line.encode())
        return {"id": ident, "stream": entry["stream"], "events": len(lines),
                "truncated": truncated, "text": "\n".join(lines) + ("\n" if lines else "")}

    def _read_array(self, entry: dict[str, Any], raw: str, limit: int) -> dict[str, Any]:
        if len(raw.encode()) > playground.MAX_EVENTS_BYTES:
            raise HTTPException(413, f"{entry['id']} is larger than the playground's "
                                     f"{playground.MAX_EVENTS_BYTES // 1024} KiB")
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise HTTPException(400, f"{entry['id']}: not JSON lines nor a JSON array: "
                                     f"{exc}") from exc
        if not isinstance(items, list):
            raise HTTPException(400, f"{entry['id']}: not a JSON array of events")
        lines = [json.dumps(x) for x in items[:limit]]
        return {"id": entry["id"], "stream": entry["stream"], "events": len(lines),
                "truncated": len(items) > limit, "text": "\n".join(lines) + "\n"}

    # -- rules ------------------------------------------------------------------------------
    def rules(self) -> tuple[list[dict[str, Any]], dict[str, CompiledRule]]:
        files = rule_files([self.rules_dir]) if self.rules_dir.exists() else []
        out, compiled = [], {}
        for f in files:
            sets, errors = check_paths([f])
            entry: dict[str, Any] = {"file": str(f.relative_to(self.rules_dir)),
                                     "status": "rejected" if errors else "accepted",
                                     "errors": [e.render() for e in errors], "rules": []}
            for rs in sets.values():
                for r in rs:
                    compiled[r.id] = r
                    entry["rules"].append({
                        "id": r.id, "version": r.version, "enabled": r.enabled,
                        "stream": r.stream.name, "key_field": r.key_field or "",
                        "severity": getattr(r, "severity", None), "alert": r.emit.alert,
                        "explain": r.explain()})
            out.append(entry)
        return out, compiled

    def rule_svg(self, rule: CompiledRule) -> bytes:
        dot = rule.nfa.to_dot(rule.id)
        cached = self._svg.get(dot)
        if cached is None:
            exe = shutil.which("dot")
            if exe is None:
                raise HTTPException(501, "Graphviz `dot` is not installed (apt-get install "
                                         "graphviz)")
            cached = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True,
                                    check=True, timeout=20).stdout
            self._svg[dot] = cached
        return cached

    # -- metrics ----------------------------------------------------------------------------
    def _snapshot(self) -> tuple[dict[str, Any] | None, str]:
        if self.metrics is None:
            return None, "the console was started without --checkpoint (the job's metrics)"
        try:
            snap = json.loads(self.metrics.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return None, f"cannot read {self.metrics}: {exc}"
        return (snap, "") if isinstance(snap, dict) else (None, f"{self.metrics}: not a map")

    def rules_live(self) -> dict[str, Any]:
        """Per rule, from the live job's metrics (jobs/metrics.py `rules_live`): alerts per
        minute (last 5 min), alerts in the last hour, and live partial matches when the job
        exports them."""
        snap, why = self._snapshot()
        if snap is None:
            return {"available": False, "why": why, "by_rule": {}}
        live = snap.get("rules_live")
        if not isinstance(live, dict):
            return {"available": False, "by_rule": {},
                    "why": "the job's metrics have no per-rule figures (an older job)"}
        return {"available": True, "age_s": round(time.time() - float(snap.get("time", 0)), 1),
                "partial_matches": any("partial_matches" in v for v in live.values()
                                       if isinstance(v, dict)),
                "alerts": any("alerts_per_min" in v for v in live.values()
                              if isinstance(v, dict)),
                "by_rule": {str(k): v for k, v in live.items() if isinstance(v, dict)}}

    def health(self) -> dict[str, Any]:
        snap, why = self._snapshot()
        if snap is None:
            return {"available": False, "why": why}
        counters = snap.get("counters", {})
        alerts = (snap.get("queries") or {}).get("alerts", {})
        lag = None
        if alerts.get("max_event_time") and alerts.get("watermark"):
            lag = alerts["max_event_time"] + " → watermark " + alerts["watermark"]
        return {"available": True, "age_s": round(time.time() - float(snap.get("time", 0)), 1),
                "events_per_s": alerts.get("processed_rows_per_s"),
                "input_per_s": alerts.get("input_rows_per_s"),
                "last_batch_ms": alerts.get("batch_ms"), "last_batch": alerts.get("batch"),
                "event_time": lag, "state_rows": alerts.get("state_rows"),
                "events_read": counters.get("events_read"), "events": counters.get("events"),
                "late": counters.get("late"), "dead_letters": counters.get("dead_letters"),
                "rules_running": len(snap.get("rules") or {}),
                "rules_files": snap.get("rules_files") or {}}

    # -- alerts -----------------------------------------------------------------------------
    def _redis(self) -> Any:
        if not self.redis_url:
            raise HTTPException(503, "the console was started without --redis")
        import redis

        return redis.Redis.from_url(self.redis_url, decode_responses=True,
                                    socket_connect_timeout=5, socket_timeout=10)

    def recent(self, limit: int = 100) -> list[dict[str, Any]]:
        client = self._redis()
        items: list[tuple[str, dict[str, Any]]] = []
        for stream in client.scan_iter(match=ALERT_STREAMS, count=500):
            for entry_id, fields in client.xrevrange(stream, count=limit):
                rec = _record(fields)
                if rec is not None:
                    items.append((entry_id, rec))
        items.sort(key=lambda x: _id_order(x[0]), reverse=True)
        return [rec for _, rec in items[:limit]]

    def counts(self, window_ms: int = 3_600_000) -> dict[str, int]:
        """Alerts per rule stream in the last `window_ms` (stream ids are arrival times)."""
        if not self.redis_url:
            return {}
        client = self._redis()
        since = int(time.time() * 1000) - window_ms
        out = {}
        for stream in client.scan_iter(match=ALERT_STREAMS, count=500):
            out[stream.split(":", 2)[2]] = len(client.xrange(stream, min=f"{since}-0",
                                                             max="+", count=100_000))
        return out

    def follow(self, *, rule: str = "", severity: str = "", key: str = "",
               seconds: float = 300.0) -> Iterator[str]:
        """Server-sent events: each new alert in any alert stream that passes the filters."""
        client = self._redis()
        # Streams that exist now: from their current last entry (the page has loaded the
        # recent ones); streams that appear later: from their first entry.
        last: dict[str, str] = {}
        for stream in client.scan_iter(match=ALERT_STREAMS, count=500):
            top = client.xrevrange(stream, count=1)
            last[stream] = top[0][0] if top else "0-0"
        stop = time.monotonic() + seconds
        # `ready` once the starting points are taken: the page says "following" on it, not when
        # the response opens (the headers go out before this generator first runs, so an alert
        # written in between was in the starting points and never sent, yet the page followed).
        yield "retry: 1000\nevent: ready\ndata: {}\n\n"
        while time.monotonic() < stop:
            for stream in client.scan_iter(match=ALERT_STREAMS, count=500):
                last.setdefault(stream, "0-0")
            if not last:
                time.sleep(0.5)
                yield ": waiting for alert streams\n\n"
                continue
            got = client.xread(dict(last), block=1000, count=500)
            if not got:
                yield ": keep-alive\n\n"
                continue
            for stream, entries in got:
                for entry_id, fields in entries:
                    last[stream] = entry_id
                    rec = _record(fields)
                    if rec is not None and _passes(rec, rule, severity, key):
                        yield f"data: {json.dumps(rec, default=str)}\n\n"

    def timeline(self, alert: dict[str, Any]) -> bytes:
        from cep.report import KeyView, draw_key, value_field

        _, compiled = self.rules()
        rule = compiled.get(str(alert.get("rule_id")))
        if rule is None:
            raise HTTPException(404, f"no rule {alert.get('rule_id')!r} in {self.rules_dir}")
        tf = rule.stream.time_field
        events = sorted((dict(e.get("event") or {}) for e in alert.get("events") or []),
                        key=lambda e: e.get(tf, 0))
        view = KeyView(str(alert.get("key", "")), events, [alert])
        return draw_key(rule, view, value_field(rule, None))


def _record(fields: dict[str, str]) -> dict[str, Any] | None:
    try:
        rec = json.loads(fields.get("data", ""))
    except json.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) else None


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _passes(rec: dict[str, Any], rule: str, severity: str, key: str) -> bool:
    return ((not rule or rec.get("rule_id") == rule)
            and (not severity or str(rec.get("severity", "")).upper() == severity.upper())
            and (not key or str(rec.get("key", "")) == key))


def create_console(console: Console, *, search_app: FastAPI | None = None) -> FastAPI:
    app = FastAPI(title="cep console", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", response_class=HTMLResponse)
    def index() -> Response:
        return FileResponse(STATIC / "console.html", media_type="text/html")

    for page in PAGES:
        app.add_api_route(f"/{page}", index, response_class=HTMLResponse, methods=["GET"],
                          name=f"page-{page}")

    @app.get("/api/rules")
    def rules() -> dict[str, Any]:
        files, _ = console.rules()
        return {"dir": str(console.rules_dir), "files": files, "alerts_last_hour":
                _safe(console.counts), "live": console.rules_live(),
                "searches": search_app is not None}

    @app.get("/api/rules-files/{name:path}")
    def rules_file(name: str) -> Response:
        return Response(console.rules_file_text(name), media_type="text/plain; charset=utf-8")

    @app.get("/api/rules/{rule_id}/svg")
    def rule_svg(rule_id: str) -> Response:
        _, compiled = console.rules()
        rule = compiled.get(rule_id)
        if rule is None:
            raise HTTPException(404, f"no rule {rule_id!r}")
        return Response(console.rule_svg(rule), media_type="image/svg+xml",
                        headers={"Content-Security-Policy": "script-src 'none'"})

    @app.get("/api/alerts/recent")
    def recent(rule: str = "", severity: str = "", key: str = "",
               limit: int = 100) -> list[dict[str, Any]]:
        return [r for r in console.recent(min(max(limit, 1), 1000))
                if _passes(r, rule, severity, key)]

    @app.get("/api/alerts/stream")
    def stream(rule: str = "", severity: str = "", key: str = "") -> StreamingResponse:
        return StreamingResponse(console.follow(rule=rule, severity=severity, key=key),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @app.post("/api/alerts/timeline")
    def timeline(body: TimelineIn) -> Response:
        return Response(console.timeline(body.alert), media_type="image/png")

    @app.post("/api/playground/run")
    def run(body: RunIn) -> JSONResponse:
        try:
            result = playground.run(body.rules, body.events, stream=body.stream)
        except playground.PlaygroundError as exc:
            raise HTTPException(413 if "larger" in str(exc) or "more than" in str(exc)
                                else 400, str(exc)) from exc
        return JSONResponse(json.loads(json.dumps(result.to_dict(), default=str)))

    @app.get("/api/playground/inputs")
    def inputs() -> list[dict[str, Any]]:
        by_stream: dict[str, set[str]] = {}
        files, _ = console.rules()
        for f in files:
            for r in f["rules"] if f["status"] == "accepted" else ():
                by_stream.setdefault(r["stream"], set()).add(f["file"])
        return [{"id": e["id"], "stream": e["stream"], "bytes": e["bytes"],
                 "rules_files": sorted(by_stream.get(e["stream"], ()))}
                for e in console.input_files().values()]

    @app.get("/api/playground/inputs/{ident:path}")
    def read_input(ident: str, limit: int = playground.MAX_EVENTS) -> dict[str, Any]:
        return console.read_input(ident, limit)

    @app.post("/api/playground/save")
    def save(body: SaveIn) -> Response:
        try:
            result = playground.run(body.rules, body.events, stream=body.stream)
        except playground.PlaygroundError as exc:
            raise HTTPException(400, str(exc)) from exc
        if result.errors:
            raise HTTPException(400, "the rules do not compile")
        text = playground.as_test_case(body.rules_file, body.name, result)
        return Response(text, media_type="application/yaml", headers={
            "Content-Disposition": 'attachment; filename="playground-test.yaml"'})

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return console.health()

    if search_app is not None:
        app.mount("/search-api", search_app)
    return app


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the rules view must render without Redis
        return {"error": str(exc)}
