"""Open-loop load over gRPC: KServe v2 `ModelInfer` on grpc.aio, with the HTTP driver's
schedule, recorder and report.

The schedule is `open_loop._Run`'s, unchanged: each request leaves at its scheduled time on a
free slot and is timed from that time, so a stalled server is charged for the wait. Only what
carries a request differs. gRPC multiplexes calls over one HTTP/2 connection, so a slot here is
a stream on one of `connections` channels (each its own TCP connection, taken in turn), and
`max_connections` caps the calls in flight. Requests are `ModelInferRequest`s serialized before
the run, and answers are not parsed: the client spends its CPU on gRPC itself, not protobuf.

A call's gRPC status is recorded as the HTTP status of the same meaning (grpc-gateway's table:
OK 200, INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, ...), so
a gRPC run reads like an HTTP one in the results, the report and the max-rate search.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import grpc

from queryserve.bench.loadgen.open_loop import _Run
from queryserve.bench.loadgen.recorder import LoadResult, _result
from queryserve.bench.loadgen.requests import _Target, parse_target
from queryserve.bench.loadgen.runner import _drive

METHOD = "/inference.GRPCInferenceService/ModelInfer"
CONNECT_TIMEOUT_S = 5.0
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class _Stream:
    """A slot for one call at a time on a channel (the HTTP driver's connection)."""

    def __init__(self, run: _GrpcRun, call: Any) -> None:
        self.run = run
        self.call = call
        self.busy = False
        self.start_ns = 0
        self.measured = False
        self.task: asyncio.Task[None] | None = None

    def send(self, start_ns: int, measured: bool, request: bytes) -> None:
        self.busy = True
        self.start_ns = start_ns
        self.measured = measured
        self.task = self.run.loop.create_task(self._answer(request))

    async def _answer(self, request: bytes) -> None:
        try:
            await self.call(request, metadata=self.run.metadata)
            status = 200
        except grpc.aio.AioRpcError as exc:
            status = HTTP_STATUS.get(exc.code(), 500)
        except Exception:  # the channel broke under the call: an error, as a dropped connection
            self.busy = False
            self.run.on_lost(self)
            return
        end_ns = time.perf_counter_ns()
        self.busy = False
        self.run.on_response(self, status, end_ns)

    def keeps_alive(self) -> bool:
        return True

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()


class _GrpcRun(_Run):
    def __init__(self, target: _Target, channels: Sequence[Any], requests: list[bytes],
                 rate: float, poisson: bool, seed: int | None, max_streams: int,
                 metadata: tuple[tuple[str, str], ...]) -> None:
        super().__init__(target, requests, rate, poisson, seed, max_streams)
        # No serializers: the requests are bytes already and the answers stay bytes.
        self.calls = [channel.unary_unary(METHOD) for channel in channels]
        self.metadata = metadata
        self.opened = 0

    async def connect(self) -> None:
        stream = _Stream(self, self.calls[self.opened % len(self.calls)])
        self.opened += 1
        self.on_connected(stream)


async def run_grpc_open_loop(
    url: str,
    bodies: list[bytes],
    rate: float,
    duration_s: float,
    *,
    poisson: bool = False,
    warmup_s: float = 1.0,
    max_connections: int = 64,
    connections: int = 4,
    headers: dict[str, str] | None = None,
    drain_s: float = 2.0,
    seed: int | None = None,
) -> LoadResult:
    """Call `ModelInfer` at ``grpc://HOST:PORT`` with the serialized ``bodies`` at ``rate``/s
    for ``warmup_s + duration_s`` seconds, as `run_open_loop` sends HTTP requests: the same
    arguments (``headers`` go as metadata), the same result."""
    if rate <= 0 or duration_s <= 0 or warmup_s < 0:
        raise ValueError("rate and duration must be > 0, warmup >= 0")
    if not bodies:
        raise ValueError("need at least one request body")
    target = parse_target(url, scheme="grpc")
    host = f"[{target.host}]" if ":" in target.host else target.host
    channels = [grpc.aio.insecure_channel(f"{host}:{target.port}", options=[
        ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per channel, not shared
        ("grpc.max_receive_message_length", -1)]) for _ in range(max(1, connections))]
    try:
        for channel in channels:  # fail fast if nothing listens, as the HTTP driver does
            await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
    except TimeoutError:
        for channel in channels:
            await channel.close()
        raise ConnectionRefusedError(f"no gRPC server answered at {host}:{target.port} within "
                                     f"{CONNECT_TIMEOUT_S:g} s") from None
    metadata = tuple((name.lower(), value) for name, value in (headers or {}).items())
    run = _GrpcRun(target, channels, list(bodies), rate, poisson, seed, max_connections,
                   metadata)
    for _ in range(min(connections, max_connections)):
        await run.connect()
    try:
        cpu, timeouts, wall = await _drive(run, warmup_s, duration_s, drain_s)
    finally:
        for channel in channels:
            await channel.close()
    return _result(run, url, rate, duration_s, poisson, cpu, timeouts, wall)
