"""Seeded sample-data generators for the three domains, with known injected pattern instances.

Each generator returns a `Dataset`: events in event-time order (each with its source position
`seq`), and the alerts the bundled rules must raise — exactly those, because the background
traffic is built so that it can never satisfy a rule (amounts, price steps, temperatures and gaps
stay far from every threshold). The thresholds live next to each generator and must agree with
`rules/`; tests/test_datagen_rules.py checks that they do, through the engine.
"""

from cep.datagen.base import Dataset, Expected, write_jsonl
from cep.datagen.fraud import fraud
from cep.datagen.machines import machines
from cep.datagen.trading import trading

GENERATORS = {"fraud": fraud, "trading": trading, "machines": machines}

__all__ = ["GENERATORS", "Dataset", "Expected", "fraud", "machines", "trading", "write_jsonl"]
