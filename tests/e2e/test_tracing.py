"""OpenTelemetry spans: a real server exports one span per request over OTLP/HTTP to a collector
stand-in on 127.0.0.1 (a plain HTTP server that decodes what the real exporter sends)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import free_port, start_server, stop_server, write_fake_model

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Collector(BaseHTTPRequestHandler):
    exports: ClassVar[list[ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:  # the standard library's name
        body = self.rfile.read(int(self.headers["content-length"]))
        Collector.exports.append(ExportTraceServiceRequest.FromString(body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Collector.exports = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()


def test_each_request_is_a_span_in_the_caller_s_trace(tmp_path: Path, collector: str) -> None:
    import tritonclient.grpc as grpcclient

    write_fake_model(tmp_path, "fake")
    grpc_port = free_port()
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "50"  # export every 50 ms, not every 5 s
    os.environ["OTEL_SERVICE_NAME"] = "search-eu"  # a fleet names its deployments
    try:
        server = start_server(tmp_path, tmp_path / "server.log", "--otlp-endpoint", collector,
                              "--grpc", f"127.0.0.1:{grpc_port}")
    finally:
        del os.environ["OTEL_BSP_SCHEDULE_DELAY"], os.environ["OTEL_SERVICE_NAME"]
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    try:
        answer = httpx.post(
            f"{server.url}/v2/models/fake/infer",
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                              "data": ["jazz"]}]},
            headers={"traceparent": traceparent, "x-request-id": "r-1"})
        assert answer.status_code == 200
        assert httpx.get(f"{server.url}/v2/models/nope").status_code == 404
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert client.get_model_metadata("fake", headers={"traceparent": traceparent,
                                                         "x-request-id": "g-1"}).name == "fake"
        with pytest.raises(grpcclient.InferenceServerException):
            client.get_model_metadata("nope", headers={"x-request-id": "g-2"})
        streamed: list[object] = []
        client.start_stream(lambda result, error: streamed.append(result or error),
                            headers={"traceparent": traceparent, "x-request-id": "s-1"})
        text = grpcclient.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"jazz"]], dtype=object))
        client.async_stream_infer("fake", [text])
        client.stop_stream()  # waits for the answer
        assert len(streamed) == 1
        client.close()
    finally:
        stop_server(server)  # a drained server sends its last batch of spans
    spans = [span for export in Collector.exports for resource in export.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    by_name = {span.name: span for span in spans}
    infer = by_name["POST /v2/models/fake/infer"]
    assert infer.trace_id.hex() == TRACE_ID and infer.parent_span_id.hex() == PARENT_ID
    attributes = {a.key: a.value for a in infer.attributes}
    assert attributes["http.response.status_code"].int_value == 200
    assert attributes["queryserve.model"].string_value == "fake"
    assert attributes["queryserve.request_id"].string_value == "r-1"
    missing = by_name["GET /v2/models/nope"]
    assert missing.trace_id.hex() != TRACE_ID  # no traceparent: a trace of its own
    assert {a.key: a.value for a in missing.attributes}[
        "http.response.status_code"].int_value == 404
    # gRPC calls too (they had no span), as OpenTelemetry's RPC conventions name them.
    calls = {next(a.value.string_value for a in span.attributes
                  if a.key == "queryserve.request_id"): span
             for span in spans if span.name == "inference.GRPCInferenceService/ModelMetadata"}
    assert calls["g-1"].trace_id.hex() == TRACE_ID
    assert calls["g-1"].parent_span_id.hex() == PARENT_ID
    found = {a.key: a.value for a in calls["g-1"].attributes}
    assert found["rpc.system"].string_value == "grpc"
    assert found["rpc.grpc.status_code"].int_value == 0
    assert found["queryserve.model"].string_value == "fake"
    stream = by_name["inference.GRPCInferenceService/ModelStreamInfer"]  # one for the stream
    assert stream.trace_id.hex() == TRACE_ID
    assert {a.key: a.value for a in stream.attributes}["rpc.grpc.status_code"].int_value == 0
    assert calls["g-2"].trace_id.hex() != TRACE_ID
    assert {a.key: a.value for a in calls["g-2"].attributes}[
        "rpc.grpc.status_code"].int_value == 5  # NOT_FOUND
    service = {a.key: a.value.string_value for export in Collector.exports
               for resource in export.resource_spans for a in resource.resource.attributes}
    assert service["service.name"] == "search-eu"


def test_a_collector_that_never_answers_does_not_hold_the_exit(tmp_path: Path) -> None:
    """Regression: with the collector down or hung, the SDK's shutdown took 30 s whatever
    --drain-timeout said (past a pod's grace period)."""
    hung = socket.socket()  # accepts connections (the kernel does) and never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    write_fake_model(tmp_path, "fast")
    endpoint = f"http://127.0.0.1:{hung.getsockname()[1]}/v1/traces"
    server = start_server(tmp_path, tmp_path / "server.log", "--otlp-endpoint", endpoint,
                          "--drain-timeout", "2")
    try:
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 5, server.log_text()
    finally:
        server.process.kill()
        hung.close()


def test_the_service_is_named_queryserve_unless_the_environment_names_it() -> None:
    from queryserve.server.tracing import Tracing

    tracing = Tracing("http://127.0.0.1:9/v1/traces")
    assert tracing.provider.resource.attributes["service.name"] == "queryserve"
    tracing.provider.shutdown()
