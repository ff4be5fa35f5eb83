"""OpenTelemetry spans (`--otlp-endpoint`, the `tracing` extra): one server span per HTTP request,
a child of the caller's trace when it sends `traceparent` (W3C Trace Context), exported in
batches over OTLP/HTTP by the SDK's own thread.

Off by default, and then the SDK is not even imported: the application checks one attribute per
request. On, a request pays for one span's start and end; export happens off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
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
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("queryserve")
        self.propagator = TraceContextTextMapPropagator()
        self.server_kind = SpanKind.SERVER
        self.error_status = StatusCode.ERROR

    def start(self, request: Request) -> Any:
        context = (self.propagator.extract(request.headers)
                   if "traceparent" in request.headers else None)
        return self.tracer.start_span(
            f"{request.method[:20]} {request.path[:200]}", context=context,
            kind=self.server_kind,
            attributes={"http.request.method": request.method[:20],
                        "url.path": request.path[:200], "queryserve.request_id": request.id})

    def end(self, span: Any, request: Request, response: Response) -> None:
        span.set_attribute("http.response.status_code", response.status)
        if request.model is not None:
            span.set_attribute("queryserve.model", request.model)
        if response.status >= 500:
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
