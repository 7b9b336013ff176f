"""PNG plots of one run's figures (matplotlib, Agg backend). Each returns the file name written,
or None when its benchmark did not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _line(out: Path, name: str, xs: list[float], ys: list[float], xlabel: str, ylabel: str,
          title: str, logx: bool = False) -> str:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return _save(fig, out, name)


def summary(out: Path, bars: list[tuple[str, float]]) -> str | None:
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [b[0] for b in bars]
    ax.barh(names, [b[1] for b in bars], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("events/s (same run)")
    ax.set_title("Fraud rules: throughput side by side")
    for i, (_, v) in enumerate(bars):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    return _save(fig, out, "summary.png")


def scaling(out: Path, scale: dict[str, Any]) -> list[str]:
    names = []
    rows = scale.get("by_keys") or []
    if rows:
        names.append(_line(out, "embedded_vs_keys.png", [r["keys"] for r in rows],
                           [r["events_per_s"] for r in rows], "distinct keys (cards)",
                           "events/s", "Embedded engine vs keys (fraud, 3 rules)", logx=True))
    rows = scale.get("by_rules") or []
    if rows:
        names.append(_line(out, "embedded_vs_rules.png", [r["n_rules"] for r in rows],
                           [r["events_per_s"] for r in rows], "rules (copies of fraud.cep)",
                           "events/s", "Embedded engine vs number of rules"))
    rows = scale.get("by_batch") or []
    if rows:
        names.append(_line(out, "embedded_vs_batch.png", [r["batch_size"] for r in rows],
                           [r["events_per_s"] for r in rows], "events per engine call",
                           "events/s", "Embedded engine vs batch size", logx=True))
    return names


def state(out: Path, st: dict[str, Any]) -> str | None:
    pts = st.get("points") or []
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["events"] for p in pts], [p["state_bytes"] / 1e6 for p in pts], marker="o",
            label="all key states (MB)")
    ax.set_xlabel("events ingested")
    ax.set_ylabel("pickled state, MB")
    ax2 = ax.twinx()
    ax2.plot([p["events"] for p in pts], [p["bytes_per_key"] for p in pts], marker="s",
             color="tab:orange", label="bytes per key")
    ax2.set_ylabel("bytes per key")
    ax.set_title(f"Engine state, fraud, {st.get('keys')} keys")
    fig.legend(loc="lower right")
    return _save(fig, out, "state_vs_events.png")


def spark_batches(out: Path, spark: dict[str, Any]) -> str | None:
    variants = {k: v for k, v in (spark.get("variants") or {}).items() if "batch_ms" in v}
    if not variants:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, v in variants.items():
        rates = [r / (ms / 1000) if ms else 0 for r, ms in zip(v["batch_rows"], v["batch_ms"],
                                                               strict=True)]
        ax.plot(range(len(rates)), rates, marker="o", label=name)
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("events/s")
    ax.set_yscale("log")
    ax.set_title("Spark local[2], per micro-batch")
    ax.legend()
    ax.grid(True, alpha=0.3)
    return _save(fig, out, "spark_batches.png")


def percolator(out: Path, perc: dict[str, Any]) -> str | None:
    rows = perc.get("rows") or []
    if not rows:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in sorted({r["workload"] for r in rows}):
        rs = [r for r in rows if r["workload"] == kind]
        a1.plot([r["queries"] for r in rs], [r["events_per_s"] for r in rs], marker="o",
                label=kind)
        a2.plot([r["queries"] for r in rs], [100 * r["verified_fraction"] for r in rs],
                marker="o", label=kind)
    for ax, lab in ((a1, "events/s"), (a2, "% of stored queries verified per event")):
        ax.set_xscale("log")
        ax.set_xlabel("stored queries")
        ax.set_ylabel(lab)
        ax.grid(True, alpha=0.3)
        ax.legend()
    a1.set_yscale("log")
    fig.suptitle("Percolator vs stored queries")
    return _save(fig, out, "percolator.png")
