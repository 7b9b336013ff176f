"""The operator's writes to Spark's state server, sent without waiting for each reply.

PySpark's state handles make one round trip per call: the Python worker writes a request to the
task's state server socket and blocks until the JVM's state-server thread has served it and
replied. The native store's call writes the same four things every micro-batch (the log row,
the shard's record, a timer deleted and one registered), and each reply is a status code. On
the shared two-core machine each of those waits cost ~1.5-2 ms, quiet (`timer_us` + `write_us`,
docs/spark-runtime.md, "The state server's round trips (session 17)"), mostly waiting for the
JVM thread to be scheduled, not its work.

`StatePipe` writes those requests to the same socket, in the order the handles would have sent
them, and reads their replies later (`drain`), before the call returns: the state server serves
them in order (it reads one request at a time from the socket, Spark's
`TransformWithStateInPySparkStateServer`), so the state is the same as with one round trip each,
and the JVM serves them while Python encodes the log row or builds the output. A request that
needs its reply (a read) first drains what is pending. The record of a shard this worker holds
can be asked for early (`PipedValueState.prefetch`): its reply is read when the store asks for it,
after the call's input is unpacked.

Every reply is read before the call yields its output (PySpark makes its own requests between
calls: the next shard's key, the expired timers), and a failed one raises there, naming the
request, as PySpark's handles raise on a failed reply. Built from PySpark 4.3's state protocol
(`pyspark.sql.streaming.proto.StateMessage_pb2`, the requests its `ValueStateClient`,
`MapStateClient` and timer calls send).
"""

from __future__ import annotations

import struct
from typing import Any

_HEADER = struct.Struct("!ii")  # protocol version 0, message length (PySpark's framing)


class StatePipe:
    """Requests on one task's state server socket whose replies are read later."""

    def __init__(self, client: Any) -> None:
        self._client = client  # PySpark's StatefulProcessorApiClient
        self._pending: list[tuple[str, str | None]] = []  # (request, prefetched state name)
        self._got: dict[str, tuple[int, str, bytes]] = {}  # prefetched replies by state name
        self.sent = 0  # requests sent without a wait (the operator's stats)

    @classmethod
    def of(cls, handle: Any) -> StatePipe | None:
        """The pipe over `handle`'s state server (None: a handle without one, e.g. the offline
        tests' dicts, whose calls are made as they come)."""
        client = getattr(handle, "_statefulProcessorApiClient", None)
        return None if client is None or not hasattr(client, "sockfile") else cls(client)

    def send(self, request: Any, what: str, prefetch: str | None = None) -> None:
        data = request.SerializeToString()
        f = self._client.sockfile
        f.write(_HEADER.pack(0, len(data)))
        f.write(data)
        self._pending.append((what, prefetch))
        self.sent += 1

    def push(self) -> None:
        """Hand what was sent to the state server now (it is served while Python works on)."""
        if self._pending:
            self._client.sockfile.flush()

    def drain(self) -> None:
        """Read every pending reply, in order; raise on the first failed one, once all are read
        (the socket then stays in step for PySpark's own requests)."""
        if not self._pending:
            return
        self._client.sockfile.flush()
        pending, self._pending = self._pending, []
        failed: list[str] = []
        for what, prefetch in pending:
            status, message, value = self._client._receive_proto_message()
            if prefetch is not None:
                self._got[prefetch] = (status, message, value)
            elif status != 0:
                failed.append(f"{what}: {message}")
        if failed:
            from pyspark.errors import PySparkRuntimeError

            raise PySparkRuntimeError(f"state server: {'; '.join(failed)}")

    def take(self, name: str) -> tuple[int, str, bytes] | None:
        """The prefetched reply for value state `name` (None: not prefetched)."""
        self.drain()
        return self._got.pop(name, None)

    def forget(self, name: str) -> None:
        """Value state `name` is written: a prefetched reply, read or still pending, is stale."""
        self._got.pop(name, None)
        self._pending = [(what, None if p == name else p) for what, p in self._pending]

    def register_timer(self, ts: int) -> None:
        from pyspark.sql.streaming.proto import StateMessage_pb2 as m

        call = m.TimerStateCallCommand(register=m.RegisterTimer(expiryTimestampMs=ts))
        self.send(m.StateRequest(statefulProcessorCall=m.StatefulProcessorCall(
            timerStateCall=call)), f"register timer {ts}")

    def delete_timer(self, ts: int) -> None:
        from pyspark.sql.streaming.proto import StateMessage_pb2 as m

        call = m.TimerStateCallCommand(delete=m.DeleteTimer(expiryTimestampMs=ts))
        self.send(m.StateRequest(statefulProcessorCall=m.StatefulProcessorCall(
            timerStateCall=call)), f"delete timer {ts}")

    def value_bytes(self, schema: Any, value: tuple[Any, ...]) -> bytes:
        return self._client._serialize_to_bytes(schema, value)  # type: ignore[no-any-return]


class PipedValueState:
    """A ValueState whose `update` goes through the pipe; reads drain it first."""

    def __init__(self, pipe: StatePipe, state: Any) -> None:
        self._pipe = pipe
        self._state = state  # PySpark's ValueState
        self._name: str = state._stateName
        self._schema = state._valueStateClient.schema

    def prefetch(self) -> None:
        """Ask for the value now; `get` reads the reply (a value must exist: the server logs a
        warning for a `get` of none, so ask only for a shard that was written)."""
        from pyspark.sql.streaming.proto import StateMessage_pb2 as m

        call = m.ValueStateCall(stateName=self._name, get=m.Get())
        self._pipe.forget(self._name)
        self._pipe.send(m.StateRequest(stateVariableRequest=m.StateVariableRequest(
            valueStateCall=call)), f"get {self._name}", prefetch=self._name)
        self._pipe.push()

    def get(self) -> tuple[Any, ...] | None:
        got = self._pipe.take(self._name)
        if got is None:
            return self._state.get()  # type: ignore[no-any-return]
        status, message, value = got
        if status != 0:
            from pyspark.errors import PySparkRuntimeError

            raise PySparkRuntimeError(f"Error getting value state: {message}")
        if not value:
            return None
        return tuple(self._pipe._client._deserialize_from_bytes(value))

    def exists(self) -> bool:
        got = self._pipe.take(self._name)
        if got is not None and got[0] == 0:
            self._pipe._got[self._name] = got  # still there for `get`
            return bool(got[2])
        return self._state.exists()  # type: ignore[no-any-return]

    def update(self, value: tuple[Any, ...]) -> None:
        from pyspark.sql.streaming.proto import StateMessage_pb2 as m

        self._pipe.forget(self._name)
        call = m.ValueStateCall(stateName=self._name, valueStateUpdate=m.ValueStateUpdate(
            value=self._pipe.value_bytes(self._schema, value)))
        self._pipe.send(m.StateRequest(stateVariableRequest=m.StateVariableRequest(
            valueStateCall=call)), f"update {self._name}")

    def clear(self) -> None:
        self._pipe.drain()
        self._pipe.forget(self._name)
        self._state.clear()


class PipedMapState:
    """A MapState whose `updateValue` goes through the pipe; every other call drains it first."""

    def __init__(self, pipe: StatePipe, state: Any) -> None:
        self._pipe = pipe
        self._state = state  # PySpark's MapState
        self._name: str = state._stateName
        self._key_schema = state._mapStateClient.user_key_schema
        self._value_schema = state._mapStateClient.value_schema

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:  # noqa: N802
        from pyspark.sql.streaming.proto import StateMessage_pb2 as m

        update = m.UpdateValue(userKey=self._pipe.value_bytes(self._key_schema, key),
                               value=self._pipe.value_bytes(self._value_schema, value))
        self._pipe.send(m.StateRequest(stateVariableRequest=m.StateVariableRequest(
            mapStateCall=m.MapStateCall(stateName=self._name, updateValue=update))),
            f"update {self._name}[{key}]")

    def __getattr__(self, name: str) -> Any:
        """Reads and the rest (`getValue`, `iterator`, `clear`, ...): PySpark's own, in order."""
        self._pipe.drain()
        return getattr(self._state, name)
