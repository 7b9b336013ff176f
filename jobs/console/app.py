"""`cep console`: one web page for rule authors and on-call (docs/console.md).

Views: rules in force (status, errors with caret, automaton SVG, recent alert counts), live
alerts from Redis (server-sent events) with a timeline per alert, a playground on the embedded
engine, saved searches (the saved-search API, mounted under /v1 with its own API keys), and the
live job's health from its metrics file.

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
                 redis_url: str | None = None) -> None:
        self.rules_dir = Path(rules_dir)
        self.metrics = Path(metrics) if metrics else None
        self.redis_url = redis_url
        self._svg: dict[str, bytes] = {}

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
    def health(self) -> dict[str, Any]:
        if self.metrics is None:
            return {"available": False, "why": "the console was started without --metrics"}
        try:
            snap = json.loads(self.metrics.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return {"available": False, "why": f"cannot read {self.metrics}: {exc}"}
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
        yield "retry: 1000\n\n"
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
                _safe(console.counts), "searches": search_app is not None}

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
