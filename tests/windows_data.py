"""Generated histories for the window tests (docs/windows.md): rules/history.cep's three
streams, with both sides of every threshold."""

from __future__ import annotations

import random

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN, DAY = 60_000, 86_400_000


def history(seed: int = 7) -> dict[str, list[dict]]:
    """Three streams over 40 days: cards with everyday spend and a few spikes, IPs with login
    noise and a few bursts, card-not-present sprees. Times are distinct per stream."""
    rnd = random.Random(seed)
    tx, logins, payments = [], [], []
    used: set[int] = set()

    def at(t: int) -> int:
        while t in used:
            t += 1
        used.add(t)
        return t

    for c in range(12):
        card = f"card-{c:02d}"
        t = T0 + rnd.randrange(DAY)
        while t < T0 + 40 * DAY:
            amount = round(rnd.uniform(5, 60), 2)
            if rnd.random() < 0.03:
                amount = round(rnd.uniform(300, 2000), 2)  # a spike
            tx.append({"ts": at(t), "card": card, "amount": amount, "merchant": "m",
                       "country": "NL"})
            t += rnd.randrange(2 * 3_600_000, 3 * DAY)
    for i in range(8):
        ip = f"10.0.0.{i}"
        for day in range(0, 40, 3):
            start = T0 + day * DAY + rnd.randrange(DAY)
            burst = rnd.choice((5, 30, 120, 150)) if i % 2 == 0 else rnd.randrange(1, 15)
            step = rnd.choice((1000, 2000, 5000))
            for k in range(burst):
                logins.append({"ts": at(start + k * step), "ip": ip, "user": f"u{k % 5}",
                               "outcome": "failure" if rnd.random() < 0.9 else "success"})
    for c in range(6):
        card = f"card-{c:02d}"
        for day in range(0, 40, 5):
            t = T0 + day * DAY + rnd.randrange(DAY)
            for _ in range(rnd.choice((3, 18, 25, 40))):
                payments.append({"ts": at(t), "card": card, "amount": round(rnd.uniform(1, 90), 2),
                                 "channel": "cnp" if rnd.random() < 0.95 else "pos"})
                t += rnd.randrange(MIN, 35 * MIN)
    return {"transactions": tx, "logins": logins, "payments": payments}
