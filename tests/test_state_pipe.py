"""`cep.spark.state_pipe` against a state server speaking Spark's protocol on a Unix socket (a
thread serving one request at a time, in order, as Spark's `TransformWithStateInPySparkStateServer`
does): piped writes land in the order they were made, a read made after them sees them, a
prefetched read returns the stored value, and a failed reply raises at `drain`, naming the
request, with the socket still in step for the next call. The operator over Spark's real state
server: tests/test_live.py (effectively-once delivery, restart from the checkpoint)."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkRuntimeError  # noqa: E402
from pyspark.sql.streaming.proto import StateMessage_pb2 as m  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle  # noqa: E402
from pyspark.sql.streaming.stateful_processor_api_client import (  # noqa: E402
    StatefulProcessorApiClient,
)
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType  # noqa: E402

from cep.spark.state_pipe import PipedMapState, PipedValueState, StatePipe  # noqa: E402

KEY = StructType([StructField("shard", IntegerType())])
BLOB = StructType([StructField("v", BinaryType())])
ROW = StructType([StructField("row", IntegerType())])


class FakeStateServer(threading.Thread):
    """One client; value states, map states and timers of one grouping key; every request is
    logged (`seen`) and served in arrival order. A value state named `broken` fails updates."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.values: dict[str, bytes] = {}
        self.maps: dict[str, dict[bytes, bytes]] = {}
        self.timers: set[int] = set()
        self.seen: list[str] = []

    def run(self) -> None:
        conn, _ = self.sock.accept()
        f = conn.makefile("rwb")
        while True:
            head = f.read(8)
            if len(head) < 8:
                return
            _, n = struct.unpack("!ii", head)
            req = m.StateRequest()
            req.ParseFromString(f.read(n))
            status, value = self.serve(req)
            out = m.StateResponse(statusCode=status, value=value,
                                  errorMessage="" if status in (0, 2) else "refused")
            data = out.SerializeToString()
            f.write(struct.pack("!i", len(data)) + data)
            f.flush()

    def serve(self, req: Any) -> tuple[int, bytes]:
        kind = req.WhichOneof("method")
        if kind == "statefulProcessorCall":
            call = req.statefulProcessorCall
            which = call.WhichOneof("method")
            if which == "timerStateCall":
                t = call.timerStateCall
                if t.WhichOneof("method") == "register":
                    self.seen.append(f"register {t.register.expiryTimestampMs}")
                    self.timers.add(t.register.expiryTimestampMs)
                else:
                    self.seen.append(f"delete {t.delete.expiryTimestampMs}")
                    self.timers.discard(t.delete.expiryTimestampMs)
            return 0, b""  # getValueState / getMapState: declared
        var = req.stateVariableRequest
        if var.WhichOneof("method") == "valueStateCall":
            v = var.valueStateCall
            op = v.WhichOneof("method")
            self.seen.append(f"{op} {v.stateName}")
            if op == "valueStateUpdate":
                if v.stateName == "broken":
                    return 1, b""
                self.values[v.stateName] = v.valueStateUpdate.value
            elif op == "get":
                return 0, self.values.get(v.stateName, b"")
            elif op == "exists":
                return (0 if v.stateName in self.values else 2), b""
            elif op == "clear":
                self.values.pop(v.stateName, None)
            return 0, b""
        c = var.mapStateCall
        op = c.WhichOneof("method")
        self.seen.append(f"{op} {c.stateName}")
        entries = self.maps.setdefault(c.stateName, {})
        if op == "updateValue":
            entries[c.updateValue.userKey] = c.updateValue.value
        elif op == "getValue":
            return 0, entries.get(c.getValue.userKey, b"")
        return 0, b""


@pytest.fixture
def served(tmp_path: Path) -> Any:
    server = FakeStateServer(tmp_path / "state.sock")
    server.start()
    client = StatefulProcessorApiClient(str(tmp_path / "state.sock"), KEY)
    handle = StatefulProcessorHandle(client)
    pipe = StatePipe.of(handle)
    assert pipe is not None
    yield server, handle, pipe
    client._client_socket.close()


def test_piped_writes_land_in_order_and_reads_see_them(served: Any) -> None:
    server, handle, pipe = served
    meta = PipedValueState(pipe, handle.getValueState("nshard", BLOB))
    log = PipedMapState(pipe, handle.getMapState("nrows", ROW, BLOB))
    before = len(server.seen)
    pipe.delete_timer(5)
    pipe.register_timer(9)
    log.updateValue((0,), (b"row 0",))
    log.updateValue((1,), (b"row 1",))
    meta.update((b"record",))
    pipe.drain()
    assert server.seen[before:] == ["delete 5", "register 9", "updateValue nrows",
                                    "updateValue nrows", "valueStateUpdate nshard"]
    assert server.timers == {9}
    assert pipe.sent == 5
    # Reads go through PySpark's own calls, after what is pending.
    log.updateValue((1,), (b"row 1 again",))
    assert log.getValue((1,)) == (b"row 1 again",)
    meta.update((b"record 2",))
    assert meta.get() == (b"record 2",)
    assert meta.exists()


def test_a_prefetched_record_is_the_stored_one_and_a_write_supersedes_it(served: Any) -> None:
    server, handle, pipe = served
    meta = PipedValueState(pipe, handle.getValueState("nshard", BLOB))
    meta.update((b"first",))
    pipe.drain()
    meta.prefetch()
    assert meta.exists()
    assert meta.get() == (b"first",)
    gets = server.seen.count("get nshard")
    meta.prefetch()
    meta.update((b"second",))  # the prefetched reply is stale now
    assert meta.get() == (b"second",)
    assert server.seen.count("get nshard") == gets + 2  # the prefetch and a fresh read


def test_a_failed_reply_raises_at_drain_and_the_socket_stays_in_step(served: Any) -> None:
    server, handle, pipe = served
    broken = PipedValueState(pipe, handle.getValueState("broken", BLOB))
    meta = PipedValueState(pipe, handle.getValueState("nshard", BLOB))
    broken.update((b"x",))
    meta.update((b"after",))
    with pytest.raises(PySparkRuntimeError, match="update broken"):
        pipe.drain()
    assert server.values["nshard"]  # served after the failed one, its reply read
    assert meta.get() == (b"after",)


def test_a_handle_without_a_state_server_has_no_pipe() -> None:
    from bench.operator import Handle, ShardState

    assert StatePipe.of(Handle(ShardState())) is None
