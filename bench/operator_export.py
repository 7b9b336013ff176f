"""The live operator's CPU per event without Spark, and the share of the core's export of
changed keys (`Engine.export_blobs`, in `NativeShardStore.flush`): bench.operator's input (each
card every 20 s, 20k events/s in 1 s batches, 8 shards), its frames built before the clock
starts, then `CepProcessor` over them batch by batch; per batch the operator's CPU per event, the
export's, and the key records it wrote per event. docs/spark-runtime.md, "The operator's export
of changed keys (session 14)".

    python -m bench.operator_export [BATCHES]     # steady: the batches after the 4th
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from bench.operator import (
    DELAY_MS,
    RULES,
    Handle,
    ShardState,
    batch_frames,
    batch_wm,
    run_batch,
)

RATE, SHARDS, STEADY_FROM = 20_000, 8, 4


def main() -> int:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    os.environ["CEP_ENGINE"] = "native"
    from cep.engines import RulesEngineFactory
    from cep.runtime.alerts import output_rows
    from cep.runtime.state_store import blob_records
    from cep.spark import operator as op

    todo = [batch_frames(b, RATE, RATE, SHARDS) for b in range(batches)]
    shard = ShardState()
    proc = op.CepProcessor(RulesEngineFactory.from_path(RULES), output_rows, DELAY_MS,
                           shards=SHARDS)
    handle = Handle(shard)
    proc.init(handle)  # type: ignore[arg-type]  # for its engine (run_batch inits per batch)
    export = {"cpu": 0.0, "records": 0}
    engine: Any = proc.engine
    core = engine.core

    class Timed:  # the core with its export timed (CPU) and its records counted
        def __getattr__(self, name: str) -> Any:
            return getattr(core, name)

        def export_blobs(self, *args: Any) -> Any:
            t = time.process_time()
            blobs = core.export_blobs(*args)
            export["cpu"] += time.process_time() - t
            export["records"] += sum(map(blob_records, blobs))
            return blobs

    engine.core = Timed()
    wm, steady = 0, [0.0, 0.0, 0]
    for b, by_shard in enumerate(todo):
        export.update(cpu=0.0, records=0)
        cpu = time.process_time()
        for _ in run_batch(proc, handle, shard, by_shard, wm):
            pass
        cpu = time.process_time() - cpu
        wm = batch_wm(b, RATE, RATE)
        print(f"batch {b}: operator {1e6 * cpu / RATE:.2f} µs/event CPU, export "
              f"{1e6 * export['cpu'] / RATE:.2f}, records {export['records'] / RATE:.2f}/event")
        if b >= STEADY_FROM:
            steady = [steady[0] + cpu, steady[1] + export["cpu"], steady[2] + RATE]
    if steady[2]:
        print(f"steady: operator {1e6 * steady[0] / steady[2]:.2f} µs/event CPU, export "
              f"{1e6 * steady[1] / steady[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
