"""The `inference.GRPCInferenceService` handlers: each RPC is decode -> the model API ->
encode, over the same repository, limits and readiness as the HTTP front end.

What every RPC goes through, in one place (`_answering`):
- **API keys**: every RPC but ServerLive and ServerReady (orchestrators probe those without
  one) needs `authorization: Bearer KEY` metadata when the server has keys, as every HTTP
  route but `/v2/health/*` needs the header. `state.auth` counts the refusals.
- **Errors**: a `QueryServeError` becomes its own status (`grpc_code`, mapped once in
  errors.py) with its message, and its headers (Retry-After...) as trailing metadata;
  anything else is logged with its traceback and answered INTERNAL "internal server error",
  which leaks nothing.
- **Messages that do not parse**: read by `lenient` into a `Malformed`, answered
  INVALID_ARGUMENT after the key check. grpc.aio answered them UNKNOWN, naming protobuf's
  exception class, and logged a 7-line traceback each: 71 KB of log for 100 calls in 0.06 s,
  from a client with no key.

`ModelStreamInfer` (tritonclient's `start_stream`, `perf_analyzer --streaming`) is a stream of
requests, not one: it checks the key once, then answers each request as the unary RPC does,
each as soon as it is done, so a stream's requests batch together.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError

from queryserve.errors import InvalidInput, QueryServeError
from queryserve.server.grpc import codec
from queryserve.server.grpc.proto import grpc_service_pb2 as pb
from queryserve.server.http_types import CLIENT_CLOSED
from queryserve.server.kserve_service import KServeService
from queryserve.server.state import ServerState

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[["InferenceService", Req], Awaitable[Resp]]
Rpc = Callable[["InferenceService", Req, Any], Awaitable[Resp]]
"""A handler as grpc.aio calls it: (service, request, `grpc.aio.ServicerContext`)."""


@dataclass(frozen=True)
class Malformed:
    """A request message that did not parse, handed to its RPC in place of the message."""

    error: str


def lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A request deserializer that returns a `Malformed` where `parse` raises."""
    def read(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return Malformed(str(exc))

    return read


async def abort(context: Any, code: grpc.StatusCode, message: str,
                metadata: tuple[tuple[str, str], ...] = ()) -> NoReturn:
    await context.abort(code, message, metadata)
    raise AssertionError("grpc.aio's abort raises")  # never reached


SERVICE = "inference.GRPCInferenceService"
STREAM_PATH = f"/{SERVICE}/ModelStreamInfer"
STREAM_IN_FLIGHT = 64
"""Requests of one stream answered at once; the next waits to be read, and HTTP/2's flow
control holds the client (one stream could otherwise queue without bound)."""


def _answering(handler: Handler[Req, Resp], keyed: bool) -> Rpc[Req, Resp]:
    path = f"/{SERVICE}/{handler.__name__}"

    @functools.wraps(handler)
    async def answer(service: InferenceService, request: Req, context: Any) -> Resp:
        state = service.state
        started = time.perf_counter()
        metadata = dict(context.invocation_metadata() or ())  # gRPC keys are lower-case
        # The request id comes back in the trailers, as HTTP's x-request-id: the client's, or
        # one made here (none was, and a call could not be found in the access log).
        request_id = state.request_ids.of(metadata.get("x-request-id"))
        echoed = (("x-request-id", request_id),)
        tracing = state.tracing
        span = (tracing.start_rpc(SERVICE, handler.__name__, metadata, request_id)
                if tracing is not None else None)
        status, code, sent = 200, grpc.StatusCode.OK, None
        try:
            if keyed:
                state.auth.check_key(_key(context), grpc=True)
            parsed = _parsed(request)
            context.set_trailing_metadata(echoed)
            sent = await handler(service, parsed)
            return sent
        except asyncio.CancelledError:
            status, code = CLIENT_CLOSED, grpc.StatusCode.CANCELLED  # the client left
            raise
        except Exception as exc:
            error = _answered_error(exc, handler.__name__, request_id)
            status, code = error.http_status, grpc.StatusCode[error.grpc_code]
            await abort(context, code, error.message, (*error.headers.items(), *echoed))
        finally:
            if state.access_log is not None or span is not None:
                model = getattr(request, "model_name", None) or getattr(request, "name", None)
                if state.access_log is not None:
                    state.access_log.line(request_id, "POST", path, model or None, status,
                                          _size(request), _size(sent),
                                          time.perf_counter() - started)
                if span is not None:
                    assert tracing is not None
                    tracing.end_rpc(span, code.value[0], model or None, status)

    return answer


def _key(context: Any) -> str | None:
    """The call's `authorization` metadata; more than one is refused, as over HTTP (the
    last was taken: a wrong key, then a right one, passed)."""
    keys = [value for name, value in context.invocation_metadata() or ()
            if name == "authorization"]
    if len(keys) > 1:
        raise InvalidInput("the call has more than one authorization metadata entry")
    return keys[0] if keys else None


def _parsed(request: Req | Malformed) -> Req:
    if isinstance(request, Malformed):
        raise InvalidInput(f"the request message does not parse: {request.error}")
    return request


def _answered_error(exc: Exception, rpc: str, request_id: str) -> QueryServeError:
    """What a call that raised `exc` answers: its own error, or, for anything else (a bug),
    "internal server error", which leaks nothing. The server's failures are logged with the
    request they met."""
    if isinstance(exc, QueryServeError):
        if exc.http_status == 500:
            log.error("gRPC %s (request %s) answered INTERNAL: %s", rpc, request_id,
                      exc.message)
        return exc
    log.error("error answering gRPC %s (request %s)", rpc, request_id, exc_info=exc)
    return QueryServeError("internal server error")


def _size(message: object) -> int:
    """A message's bytes on the wire (0: none, or one that did not parse)."""
    size = getattr(message, "ByteSize", None)
    return int(size()) if size is not None else 0


def _rpc(handler: Handler[Req, Resp]) -> Rpc[Req, Resp]:
    return _answering(handler, keyed=True)


def _public_rpc(handler: Handler[Req, Resp]) -> Rpc[Req, Resp]:
    return _answering(handler, keyed=False)


class InferenceService:
    """The service's RPCs, named as the proto names them (the generated
    `add_GRPCInferenceServiceServicer_to_server` looks them up by name)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.service = KServeService(state)
        self.ending = asyncio.Event()
        """Set when the server drains: a stream ends once its requests read are answered
        (grpc.aio would hold it open for the whole grace period, then cancel it)."""

    @_public_rpc
    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @_public_rpc
    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    @_rpc
    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready_or_not(request.name,
                                                                           request.version))

    @_rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             ) -> pb.ServerMetadataResponse:
        return codec.server_metadata()

    @_rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            ) -> pb.ModelMetadataResponse:
        return codec.model_metadata(self.service.metadata(request.name, request.version))

    @_rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        return codec.model_config(self.service.config(request.name, request.version))

    @_rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              ) -> pb.ModelStatisticsResponse:
        return codec.model_statistics(await self.service.statistics(
            request.name or None, request.version))

    @_rpc
    async def ModelInfer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        return await self._infer(request)

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        answer = await self.service.infer(
            request.model_name, request.model_version,
            lambda config, max_items: codec.decode_infer_request(request, config, max_items))
        return codec.encode_infer_response(answer)

    async def ModelStreamInfer(self, requests: Any, context: Any) -> None:
        """Each request's answer, in the order they are done (a response's `id` is its
        request's); a request that fails is answered with its `error_message` and the stream
        goes on, as Triton's does. Ends when the client closes its side, or once the requests
        read are answered when the server drains."""
        state = self.state
        metadata = dict(context.invocation_metadata() or ())
        echoed = (("x-request-id", state.request_ids.of(metadata.get("x-request-id"))),)
        try:
            state.auth.check_key(_key(context), grpc=True)
        except QueryServeError as exc:
            await abort(context, grpc.StatusCode[exc.grpc_code], exc.message,
                        (*exc.headers.items(), *echoed))
        context.set_trailing_metadata(echoed)
        tracing = state.tracing  # one span for the stream, as for a unary call
        span = (tracing.start_rpc(SERVICE, "ModelStreamInfer", metadata, echoed[0][1])
                if tracing is not None else None)
        code = grpc.StatusCode.CANCELLED  # unless it ends
        slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        writing = asyncio.Lock()  # one message at a time on the stream
        answering: set[asyncio.Future[None]] = set()

        async def answer(request: pb.ModelInferRequest | Malformed) -> None:
            try:
                response = await self._stream_answer(request, echoed[0][1])
                async with writing:
                    await context.write(response)
            finally:
                slots.release()

        ending = asyncio.ensure_future(self.ending.wait())
        reading: asyncio.Future[Any] | None = None
        try:
            while True:
                await slots.acquire()
                reading = asyncio.ensure_future(context.read())
                await asyncio.wait({reading, ending}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done() or reading.result() is grpc.aio.EOF:
                    break
                task = asyncio.ensure_future(answer(reading.result()))
                answering.add(task)
                task.add_done_callback(answering.discard)
            if answering:
                await asyncio.wait(set(answering))
            code = grpc.StatusCode.OK
        finally:  # ended, drained, or the client went away (its answers go nowhere)
            for left in (ending, reading, *answering):
                if left is not None:
                    left.cancel()
            if span is not None:
                assert tracing is not None
                tracing.end_rpc(span, code.value[0], None,
                                200 if code == grpc.StatusCode.OK else CLIENT_CLOSED)

    async def _stream_answer(self, request: pb.ModelInferRequest | Malformed,
                             request_id: str) -> pb.ModelStreamInferResponse:
        """One streamed request's response, or its error as Triton streams it; with an access
        log line, as a unary call has."""
        started = time.perf_counter()
        status, response = 200, None
        model = getattr(request, "model_name", "") or None
        try:
            parsed: pb.ModelInferRequest = _parsed(request)
            response = pb.ModelStreamInferResponse(infer_response=await self._infer(parsed))
        except Exception as exc:
            error = _answered_error(exc, "ModelStreamInfer", request_id)
            status, response = error.http_status, self._stream_error(request, error.message)
        finally:
            if self.state.access_log is not None:
                self.state.access_log.line(request_id, "POST", STREAM_PATH, model, status,
                                           _size(request), _size(response),
                                           time.perf_counter() - started)
        return response

    @staticmethod
    def _stream_error(request: object, message: str) -> pb.ModelStreamInferResponse:
        return pb.ModelStreamInferResponse(error_message=message, infer_response=(
            pb.ModelInferResponse(model_name=getattr(request, "model_name", ""),
                                  id=getattr(request, "id", ""))))

    @_rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              ) -> pb.RepositoryIndexResponse:
        _one_repository(request.repository_name)
        return codec.repository_index(self.service.index(request.ready))

    @_rpc
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  ) -> pb.RepositoryModelLoadResponse:
        _one_repository(request.repository_name)
        await self.service.load(request.model_name, codec.parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    ) -> pb.RepositoryModelUnloadResponse:
        _one_repository(request.repository_name)
        await self.service.unload(request.model_name, codec.parameters(request.parameters))
        return pb.RepositoryModelUnloadResponse()


def _one_repository(name: str) -> None:
    """A server of one repository refuses to act on a named one (as Triton refuses
    `repository_name`), rather than act on its own: a reload meant for another went here."""
    if name:
        raise InvalidInput(f"repository_name '{name[:100]}' is not supported: this server "
                           "serves one repository; leave it empty")
