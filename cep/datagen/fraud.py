"""Card transactions {ts, card, amount, merchant, country}, keyed by card.

Background: each card shops in its home country, every 10-40 minutes, amounts 5.00-300.00.
Injected, each on its own card with 3 h of quiet around it:
- card_testing: 3 charges under 2.00, 30 s apart, then one of 800-2000 a minute later
  (rule: 3+ consecutive charges < 2.00, then one >= 500, within 30 min);
- velocity: 5 charges 8 s apart (rule: 5 consecutive charges within 1 min; background gaps
  are at least 10 minutes);
- impossible_travel: a charge at home, then one abroad 20 minutes later (rule: two consecutive
  charges in different countries within 1 h; background never changes country).
"""

from __future__ import annotations

import random

from cep.datagen.base import HOUR, MINUTE, SECOND, T0, Dataset, Expected

COUNTRIES = ("NL", "DE", "FR", "BE", "ES", "IT", "GB", "US", "BR", "JP")


def fraud(n_events: int = 10_000, n_keys: int = 200, seed: int = 1, inject: int = 3) -> Dataset:
    rng = random.Random(seed)
    ds = Dataset("transactions", [])
    per_card = max(2, n_events // n_keys)
    cards = [f"card-{i:05d}" for i in range(n_keys)]
    home = {c: rng.choice(COUNTRIES) for c in cards}
    special = cards[: 3 * inject]  # cards that get an injection, one kind each

    def tx(ts: int, card: str, amount: float, country: str | None = None) -> None:
        ds.events.append({"ts": ts, "card": card, "amount": round(amount, 2),
                          "merchant": f"m-{rng.randrange(500):03d}",
                          "country": country or home[card]})

    for idx, card in enumerate(cards):
        t = T0 + rng.randrange(30 * MINUTE)
        n = per_card
        inject_at = n // 2 if card in special else -1
        for i in range(n):
            if i == inject_at:
                t += 3 * HOUR
                kind = ("card_testing", "velocity", "impossible_travel")[idx % 3]
                first = t
                if kind == "card_testing":
                    for _ in range(3):
                        tx(t, card, rng.uniform(0.5, 1.99))
                        t += 30 * SECOND
                    t += 30 * SECOND
                    tx(t, card, rng.uniform(800, 2000))
                elif kind == "velocity":
                    for j in range(5):
                        tx(t, card, rng.uniform(10, 100))
                        if j < 4:
                            t += 8 * SECOND
                else:
                    tx(t, card, rng.uniform(20, 200))
                    t += 20 * MINUTE
                    tx(t, card, rng.uniform(20, 200),
                       rng.choice([c for c in COUNTRIES if c != home[card]]))
                ds.expected.append(Expected(kind, card, first, t))
                t += 3 * HOUR
            tx(t, card, rng.uniform(5, 300))
            t += rng.randrange(10 * MINUTE, 40 * MINUTE)
    return ds.finish()
