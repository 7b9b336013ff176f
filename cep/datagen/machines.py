"""Machine events {ts, machine, kind, temperature?}, keyed by machine, on one stream.

kind is "reading" (with a temperature) or "heartbeat". Background: a reading every 30 s with
temperature 40-60 °C, a heartbeat every 30 s (offset by 15 s).
Injected, each on its own machine:
- rising_temperature: 4 readings, each hotter than the one before, the last above 90 °C
  (rule: 4 readings, each hotter than the one before with no cooler reading between, from a warm
  one (> 60) to a critical one (> 90), within 10 min; heartbeats may come between them);
- missing_heartbeat: heartbeats stop for 10 minutes (rule: a heartbeat not followed by another
  within 2 minutes; the alert's last time is the silent heartbeat's).
"""

from __future__ import annotations

import random

from cep.datagen.base import MINUTE, SECOND, T0, Dataset, Expected


def machines(n_events: int = 10_000, n_keys: int = 50, seed: int = 3, inject: int = 3) -> Dataset:
    rng = random.Random(seed)
    ds = Dataset("machine_events", [])
    per = max(20, n_events // (2 * n_keys))  # readings per machine; as many heartbeats
    names = [f"machine-{i:04d}" for i in range(n_keys)]
    special = names[: 2 * inject]

    ramp = (65.0, 75.0, 85.0, 95.0)
    for idx, m in enumerate(names):
        t = T0 + rng.randrange(10 * SECOND)
        inject_at = per // 2 if m in special else -1
        rising = idx % 2 == 0
        silent_until = -1
        for i in range(per):
            # Every machine keeps the same cadence, so all timelines end together and no
            # machine's last heartbeat looks missing at the end of the input.
            temp = round(rng.uniform(40, 60), 1)
            if inject_at >= 0 and rising and inject_at <= i < inject_at + len(ramp):
                temp = ramp[i - inject_at]
                if i == inject_at + len(ramp) - 1:
                    first = t - (len(ramp) - 1) * 30 * SECOND
                    ds.expected.append(Expected("rising_temperature", m, first, t))
            elif i == inject_at:
                silent_until = t + 10 * MINUTE
                last_hb = t - 15 * SECOND
                ds.expected.append(Expected("missing_heartbeat", m, last_hb, last_hb))
            ds.events.append({"ts": t, "machine": m, "kind": "reading", "temperature": temp})
            if t + 15 * SECOND > silent_until:
                ds.events.append({"ts": t + 15 * SECOND, "machine": m, "kind": "heartbeat"})
            t += 30 * SECOND
    return ds.finish()
