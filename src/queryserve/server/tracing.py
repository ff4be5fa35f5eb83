"""OpenTelemetry spans (`--otlp-endpoint`, the `tracing` extra): one server span per HTTP request
and per gRPC call, a child of the caller's trace when it sends `traceparent` (W3C Trace Context,
a header or gRPC metadata), exported in batches over OTLP/HTTP by the SDK's own thread.

Off by default, and then the SDK is not even imported: the application checks one attribute per
request. On, a request pays for one span's start and end; export happens off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from queryserve.errors import ServeError
from queryserve.server.http import Request, Response

log = logging.getLogger(__name__)


class Tracing:
    def __init__(self, endpoint: str, service_name: str = "queryserve") -> None:
        """`endpoint`: the collector's OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, StatusCode
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise ServeError("--otlp-endpoint needs the tracing extra: "
                             "pip install 'queryserve[tracing]'") from None
        # Shut down by `close`, within the drain's time: at exit, the SDK's own handler would
        # wait for the collector again.
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the service when set (a fleet
        # names each deployment); `service_name` only where they do not.
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service_name}))
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("queryserve")
        self.propagator = TraceContextTextMapPropagator()
        self.server_kind = SpanKind.SERVER
        self.error_status = StatusCode.ERROR

    def start(self, request: Request) -> Any:
        return self._start(f"{request.method[:20]} {request.path[:200]}", request.headers,
                           {"http.request.method": request.method[:20],
                            "url.path": request.path[:200], "queryserve.request_id": request.id})

    def end(self, span: Any, request: Request, response: Response) -> None:
        span.set_attribute("http.response.status_code", response.status)
        self._end(span, request.model, response.status)

    def start_rpc(self, service: str, method: str, metadata: Mapping[str, str],
                  request_id: str) -> Any:
        """A gRPC call's span, named and described as OpenTelemetry's RPC conventions say."""
        return self._start(f"{service}/{method}", metadata,
                           {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method,
                            "queryserve.request_id": request_id})

    def end_rpc(self, span: Any, code: int, model: str | None, status: int) -> None:
        """`code`: the gRPC status code's number; `status`: the same outcome's HTTP status."""
        span.set_attribute("rpc.grpc.status_code", code)
        self._end(span, model, status)

    def _start(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Any:
        context = self.propagator.extract(carrier) if "traceparent" in carrier else None
        return self.tracer.start_span(name, context=context, kind=self.server_kind,
                                      attributes=attributes)

    def _end(self, span: Any, model: str | None, status: int) -> None:
        if model is not None:
            span.set_attribute("queryserve.model", model)
        if status >= 500:
            span.set_status(self.error_status)
        span.end()

    async def close(self, timeout_s: float) -> None:
        """Send what is still batched, then stop the exporter's thread, for `timeout_s` at
        most: with the collector down or slow, the SDK's shutdown took 30 s whatever
        --drain-timeout said, past a pod's grace period. What is not sent by then is
        dropped (the exporter's thread is a daemon: it does not hold the exit)."""
        done = threading.Event()

        def shut_down() -> None:
            try:
                self.provider.shutdown()
            finally:
                done.set()

        threading.Thread(target=shut_down, name="otel-shutdown", daemon=True).start()
        if not await asyncio.get_running_loop().run_in_executor(None, done.wait, timeout_s):
            log.warning("the spans not sent to the collector within %.1f s are dropped",
                        timeout_s)
