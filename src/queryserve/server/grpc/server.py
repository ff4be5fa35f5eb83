"""The gRPC listener: grpc.aio on the server's own event loop, beside the HTTP listener.

grpc.aio runs every RPC as a coroutine on the running loop, so a gRPC request reaches the same
models, schedulers and statistics as an HTTP one with no thread hop; the schedulers' batches
mix requests from both.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import grpc

from queryserve.errors import ServeError
from queryserve.server.grpc.proto.grpc_service_pb2_grpc import (
    add_GRPCInferenceServiceServicer_to_server,
)
from queryserve.server.grpc.service import InferenceService, lenient
from queryserve.server.http_types import HttpLimits
from queryserve.server.state import ServerState

log = logging.getLogger(__name__)

class GrpcServer:
    """A listening gRPC server; `shutdown` drains it."""

    def __init__(self, server: grpc.aio.Server, service: InferenceService, port: int) -> None:
        self._server = server
        self._service = service
        self.port = port
        """The port it listens on (the one asked for, or the one picked for port 0)."""

    async def shutdown(self, timeout_s: float) -> None:
        """Stop accepting RPCs at once; those in flight get `timeout_s` to finish, then are
        cancelled. A stream ends once the requests it had read are answered."""
        self._service.ending.set()
        await self._server.stop(grace=timeout_s)


class _Lenient:
    """The server, as the generated code registers the service's handlers on it: each
    message is read by `lenient`, so one that does not parse reaches the RPC."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come next, by name, to `add_registered_method_handlers`

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        handlers = {name: handler._replace(
            request_deserializer=lenient(handler.request_deserializer))
            for name, handler in handlers.items()}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),))
        self._server.add_registered_method_handlers(service, handlers)


async def start_grpc_server(state: ServerState, host: str, port: int,
                            limits: HttpLimits | None = None, reuse_port: bool = False,
                            grace_s: float = 30.0) -> GrpcServer:
    """Listen on `host:port` (port 0: any free port) and serve KServe v2 gRPC, within the
    limits HTTP has (`HttpLimits`), as gRPC can hold them: a request message over
    `max_body_bytes` is refused (RESOURCE_EXHAUSTED) before it is read; connections over
    `max_connections` are closed at once; one that has not completed HTTP/2's opening within
    `header_timeout_s`, or has had no call for `idle_timeout_s`, is closed (the port had no such
    bounds: silent sockets piled up until the process ran out of files); one older than
    `max_connection_age_s` is ended (GOAWAY) once its calls have had `grace_s` to finish, and
    the client reconnects, placed afresh (`http_types.MAX_CONNECTION_AGE_S` says why). With
    `reuse_port`, beside the other workers' listeners on the same port."""
    limits = limits or HttpLimits()
    aging = [] if math.isinf(limits.max_connection_age_s) else [
        ("grpc.max_connection_age_ms", _ms(limits.max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", _ms(grace_s))]
    server = grpc.aio.server(options=[
        *aging,
        ("grpc.max_receive_message_length", limits.max_body_bytes),
        # Answers are bounded by the item limit; refusing one already computed helps nobody.
        ("grpc.max_send_message_length", -1),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.server_handshake_timeout_ms", _ms(limits.header_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(limits.idle_timeout_s)),
        # Without this a second server could bind the same port (SO_REUSEPORT) and the two
        # would share its connections: a taken port must be an error, as it is for HTTP. A
        # server's own workers share it on purpose (their supervisor checked it was free).
        ("grpc.so_reuseport", int(reuse_port)),
    ])
    service = InferenceService(state)
    add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]  # generated
        service, _Lenient(server))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # grpcio raises "Failed to bind to address ..."
        bound = 0
    if not bound:
        raise ServeError(f"cannot listen for gRPC on {address}: the port is taken or the "
                         "address is not this machine's")
    await server.start()
    return GrpcServer(server, service, int(bound))


def _ms(seconds: float) -> int:
    """gRPC's options are C ints of milliseconds: a limit past that is as good as none."""
    return min(round(seconds * 1000), 2**31 - 1)
