"""make bench's trading step spreads the core's runs over the Python engine's run (bench.native's
docstring): a run of the core before the Python engine, one between each two of its batches and
one after it, with the same alerts and the Python engine's time counted without the core's."""

from __future__ import annotations

from typing import Any

from bench import native
from bench.workloads import dataset, load_rules, rules_path, stream_of
from cep.runtime.bind import build_embedded_engine, build_engine
from cep.runtime.engine import events_from_dicts


class _Logged:
    """The Python engine, logging its calls in `log`."""

    def __init__(self, engine: Any, log: list[str]) -> None:
        self.engine, self.log, self.tables = engine, log, getattr(engine, "tables", None)

    def ingest(self, *args: Any) -> Any:
        self.log.append("python")
        return self.engine.ingest(*args)

    def advance(self, *args: Any, **kw: Any) -> Any:
        self.log.append("python end")
        return self.engine.advance(*args, **kw)


def test_the_core_runs_between_the_python_engines_batches() -> None:
    ruleset = load_rules(rules_path(native.RULES, "trading"))
    events = sorted(events_from_dicts(stream_of(ruleset), dataset("trading", 3_000, 20, 10).events),
                    key=lambda e: (e.ts, e.seq))
    log: list[str] = []

    def make() -> Any:
        log.append("core")
        return build_embedded_engine(ruleset, use_native=True)

    (_, py_alerts, _, py_cpu, n), (_, alerts, _, cpu, _) = native._spread(
        events, native.arrow_batches(events, 100_000),
        _Logged(build_engine(ruleset, use_native=False), log), make, 4)
    assert log == ["core", "python", "core", "python", "core", "python", "python end", "core"]
    assert n == len(events) and py_alerts == alerts and alerts
    assert py_cpu > 0 and cpu > 0
