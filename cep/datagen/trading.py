"""Ticks {ts, symbol, price, bid, ask, volume}, keyed by symbol.

Background: a tick every 1-3 s per symbol; the price moves at most 0.05 % a tick; the spread
(ask - bid) is 0.02 % of the price.
Injected, each on its own symbol:
- rise_then_drop: 4 ticks each rising 1 %, then a tick dropping 4 % (rule: a base tick, then 3+
  consecutive rises of more than 0.5 % each, then a drop of more than 3 % from the last rise,
  within 5 min; the alert starts at the base tick);
- spread_spike: one tick whose spread is 1 % of the price (rule: 5+ calm ticks, spread under
  0.2 %, then a tick whose spread is over 3x their average, within 1 min; the alert starts at
  the earliest calm tick within that minute).
"""

from __future__ import annotations

import random

from cep.datagen.base import SECOND, T0, Dataset, Expected


def trading(n_events: int = 10_000, n_keys: int = 50, seed: int = 2, inject: int = 3) -> Dataset:
    rng = random.Random(seed)
    ds = Dataset("ticks", [])
    per = max(10, n_events // n_keys)
    symbols = [f"SYM{i:04d}" for i in range(n_keys)]
    special = symbols[: 2 * inject]

    def tick(ts: int, sym: str, price: float, spread_frac: float = 0.0002) -> None:
        half = price * spread_frac / 2
        ds.events.append({"ts": ts, "symbol": sym, "price": round(price, 6),
                          "bid": round(price - half, 6), "ask": round(price + half, 6),
                          "volume": rng.randrange(1, 1000)})

    for idx, sym in enumerate(symbols):
        t = T0 + rng.randrange(5 * SECOND)
        price = rng.uniform(10, 500)
        inject_at = per // 2 if sym in special else -1
        last_tick = t
        for i in range(per):
            if i == inject_at:
                if idx % 2 == 0:
                    first = last_tick
                    for _ in range(4):
                        price *= 1.01
                        tick(t, sym, price)
                        t += 2 * SECOND
                    price *= 0.96
                    tick(t, sym, price)
                    ds.expected.append(Expected("rise_then_drop", sym, first, t))
                else:
                    tick(t, sym, price, spread_frac=0.01)
                    calm_from = min(e["ts"] for e in ds.events
                                    if e["symbol"] == sym and e["ts"] >= t - 60 * SECOND)
                    ds.expected.append(Expected("spread_spike", sym, calm_from, t))
                t += rng.randrange(1 * SECOND, 3 * SECOND)
            price *= 1 + rng.uniform(-0.0005, 0.0005)
            tick(t, sym, price)
            last_tick = t
            t += rng.randrange(1 * SECOND, 3 * SECOND)
    return ds.finish()
