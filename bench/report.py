"""bench/results/latest.md from one run's results (every figure here was measured in that run)."""

from __future__ import annotations

from typing import Any

TARGET_EMBEDDED = 500_000   # events/s on one core, fraud rules (issue 7)
TARGET_CEILING = 0.8        # Spark path / no-op stateful ceiling
TARGET_FLINK = 1.0          # Spark path / Flink CEP
TARGET_VERIFIED = 0.01      # percolator: fraction of stored queries verified per event
TARGET_PEER = 1.0           # percolator at the most stored queries / mokaccino, / Lucene Monitor
TARGET_P99_S = 1.0          # Kafka end-to-end p99 at 20k events/s, seconds


def _n(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _met(v: float | None, target: float, below: bool = False) -> str:
    if v is None:
        return "not measured"
    ok = v < target if below else v >= target
    return "**met**" if ok else "missed"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def headline(res: dict[str, Any]) -> dict[str, float | None]:
    """The figures the targets are about (None where a benchmark did not run)."""
    emb = (res.get("embedded") or {}).get("fraud") or {}
    variants = (res.get("spark") or {}).get("variants") or {}

    def rate(v: str) -> float | None:
        return (variants.get(v) or {}).get("events_per_s")

    ceilings = [x for x in (rate("ceiling_tws"), rate("ceiling_aipws")) if x]
    flink = (res.get("flink") or {}).get("events_per_s")
    ours = rate("ours")
    return {
        "embedded": emb.get("events_per_s"), "embedded_incl_convert":
        emb.get("events_per_s_incl_convert"), "spark_ours": ours,
        "ceiling_tws": rate("ceiling_tws"), "ceiling_aipws": rate("ceiling_aipws"),
        "jvm_only": rate("jvm_only"), "state_only": rate("state_only"),
        "spark_kafka": rate("ours_kafka"),
        "ceiling": max(ceilings) if ceilings else None,
        "flink": flink, "flink_cold": (res.get("flink") or {}).get("cold_events_per_s"),
        "ours_over_ceiling": _ratio(ours, max(ceilings) if ceilings else None),
        "ours_over_ceiling_tws": _ratio(ours, rate("ceiling_tws")),
        "ours_over_ceiling_aipws": _ratio(ours, rate("ceiling_aipws")),
        "ours_over_flink": _ratio(ours, flink),
        "ours_over_state_only": _ratio(ours, rate("state_only")),
        "embedded_over_flink": _ratio(emb.get("events_per_s"), flink),
        "embedded_over_target": _ratio(emb.get("events_per_s"), TARGET_EMBEDDED),
        **_peers(res), **_latency(res),
    }


def _largest(section: dict[str, Any] | None) -> dict[str, Any]:
    rows = (section or {}).get("rows") or []
    return max(rows, key=lambda r: r["queries"]) if rows else {}


def _peers(res: dict[str, Any]) -> dict[str, Any]:
    mk, lu = _largest(res.get("mokaccino")), _largest(res.get("lucene"))
    ours_text = [r for r in (res.get("percolator") or {}).get("rows", [])
                 if r["workload"] == "text"]
    verified = max(ours_text, key=lambda r: r["queries"])["verified_fraction"] \
        if ours_text else None
    return {"mokaccino_queries": mk.get("queries"), "ours_over_mokaccino": mk.get("ratio"),
            "mokaccino_eps": mk.get("mokaccino_events_per_s"),
            "ours_struct_subset_eps": mk.get("ours_events_per_s"),
            "lucene_queries": lu.get("queries"), "ours_over_lucene": lu.get("ours_over_lucene"),
            "lucene_eps": lu.get("lucene_events_per_s"),
            "ours_text_eps": lu.get("ours_events_per_s"), "text_verified": verified}


def latency_at(res: dict[str, Any], variant: str, rate: int) -> dict[str, Any] | None:
    """The measured phase of a latency variant at one input rate (None if not run)."""
    for v in (res.get("latency") or {}).get("variants", []):
        if v["name"] == variant:
            for r in v["rates"]:
                if r["rate_target"] == rate:
                    return dict(r)
    return None


def _latency(res: dict[str, Any]) -> dict[str, Any]:
    at = latency_at(res, "default", 20_000)
    p99 = ((at or {}).get("latency_s") or {}).get("p99")
    return {"p99_20k_s": p99["s"] if p99 else None,
            "p99_20k_lower_bound": bool(p99 and p99["lower_bound"]),
            "kept_up_20k": (at or {}).get("kept_up")}


def other_target_rows(h: dict[str, Any]) -> list[str]:
    """The targets besides the fraud throughput ones."""
    p99 = h.get("p99_20k_s")
    rows = [
        ["percolator structured / mokaccino", _n(h.get("mokaccino_queries")) + " queries "
         "(compared subset)", f"ours {_n(h.get('ours_struct_subset_eps'))}, mokaccino "
         f"{_n(h.get('mokaccino_eps'))} ev/s", _n(h.get("ours_over_mokaccino"), 2),
         f"≥ {TARGET_PEER}", _met(h.get("ours_over_mokaccino"), TARGET_PEER)],
        ["percolator text / Lucene Monitor", _n(h.get("lucene_queries")) + " queries",
         f"ours {_n(h.get('ours_text_eps'))}, Lucene {_n(h.get('lucene_eps'))} ev/s",
         _n(h.get("ours_over_lucene"), 3), f"≥ {TARGET_PEER}",
         _met(h.get("ours_over_lucene"), TARGET_PEER)],
        ["percolator text: queries verified per event", "most queries",
         "" if h.get("text_verified") is None else f"{100 * h['text_verified']:.2f} %", "",
         "< 1 %", _met(h.get("text_verified"), TARGET_VERIFIED, below=True)],
        ["Kafka end-to-end p99 (produce → Redis), default trigger", "20k ev/s",
         "—" if p99 is None else f"{'≥ ' if h.get('p99_20k_lower_bound') else ''}{p99:.2f} s",
         "", f"< {TARGET_P99_S:.0f} s", _met(p99, TARGET_P99_S, below=True)],
    ]
    return _table(["what", "size", "measured", "ratio", "target", "target met?"], rows)


def summary_rows(res: dict[str, Any], h: dict[str, float | None]) -> list[str]:
    sizes = res["meta"]["sizes"]
    n, k = sizes["events"], sizes["keys"]
    rows = [
        ["embedded engine, 1 core (engine only)", f"fraud {n:,} ev / {k:,} cards",
         _n(h["embedded"]), f"{_n(h['embedded_over_target'], 3)} of target",
         f"≥ {TARGET_EMBEDDED:,} ev/s", _met(h["embedded"], TARGET_EMBEDDED)],
        ["embedded engine, 1 core (incl. dict→Event)", "same", _n(h["embedded_incl_convert"]),
         "", "", ""],
        ["Spark path local[2], ours (steady)", f"files, {res.get('spark', {}).get('shards', 64)}"
         " shards", _n(h["spark_ours"]), "", "", ""],
        ["Spark path local[2], ours, from Kafka (steady)", "same events, 4 partitions",
         _n(h.get("spark_kafka")), "", "", ""],
        ["ceiling: transformWithStateInPandas no-op", "same source+shuffle",
         _n(h["ceiling_tws"]), _n(h["ours_over_ceiling_tws"], 3) + " (ours/this)", "", ""],
        ["ceiling: applyInPandasWithState no-op", "same source+shuffle",
         _n(h["ceiling_aipws"]), _n(h["ours_over_ceiling_aipws"], 3) + " (ours/this)", "", ""],
        ["**ours / ceiling** (faster no-op)", "", "", _n(h["ours_over_ceiling"], 3),
         f"≥ {TARGET_CEILING}", _met(h["ours_over_ceiling"], TARGET_CEILING)],
        ["state traffic only: JSON + our state store, no engine (`--spark-variants`)",
         "same source+shuffle", _n(h["state_only"]),
         _n(h["ours_over_state_only"], 3) + " (ours/this)" if h["state_only"] else "not run",
         "", ""],
        ["JVM only (parse+fan-out, noop sink)", "same source", _n(h["jvm_only"]), "", "", ""],
        ["Flink CEP 1.x local, p=2 (warm run)", "same files", _n(h["flink"]), "", "", ""],
        ["Flink CEP (cold first run)", "same files", _n(h["flink_cold"]), "", "", ""],
        ["**ours (Spark) / Flink**", "", "", _n(h["ours_over_flink"], 3),
         f"≥ {TARGET_FLINK}", _met(h["ours_over_flink"], TARGET_FLINK)],
        ["embedded (1 core) / Flink (2 slots)", "", "", _n(h["embedded_over_flink"], 3), "",
         ""],
    ]
    fl = res.get("flink") or {}
    if fl.get("flink_version"):
        rows[9][0] = f"Flink CEP {fl['flink_version']} local, p={fl.get('parallelism')} (warm)"
    return _table(["what", "workload", "events/s", "ratio", "target", "target met?"], rows)


def alert_rows(res: dict[str, Any]) -> list[str]:
    expected = res.get("expected_fraud") or []
    exp = set(map(tuple, expected))
    rows = []
    sources = [("embedded engine", ((res.get("embedded") or {}).get("fraud") or {}).get("found")),
               ("Spark path (ours), from files", ((res.get("spark") or {}).get("variants")
                                                  or {}).get("ours", {}).get("alerts")),
               ("Spark path (ours), from Kafka", ((res.get("spark") or {}).get("variants")
                                                  or {}).get("ours_kafka", {}).get("alerts")),
               ("Flink CEP", (res.get("flink") or {}).get("alerts"))]
    for name, found in sources:
        if found is None:
            rows.append([name, "—", "—", "—", "not run"])
            continue
        got = set(map(tuple, found))
        by_rule: dict[str, int] = {}
        for a in found:
            by_rule[a[0]] = by_rule.get(a[0], 0) + 1
        rows.append([name, str(len(found)), ", ".join(f"{r} {c}" for r, c in
                                                      sorted(by_rule.items())),
                     f"{len(exp - got)} missing / {len(got - exp)} extra",
                     "identical to injected" if got == exp else "DIFFERS"])
    return _table(["engine", "alerts", "by rule", "vs injected", "verdict"], rows)
