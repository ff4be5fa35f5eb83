"""Malformed KServe v2 gRPC requests never get INTERNAL: generated `ModelInferRequest`s (wrong
names, datatypes, shapes, typed and raw contents, parameters, outputs, classification) against
the prepared models on a real server, through a real gRPC channel. Every answer is OK or a
status that says the client is at fault, and comes within seconds; the server still answers a
good request the same afterwards."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import REPOSITORY, free_port, start_server, stop_server

MODELS = ("embed", "intent", "duplicates", "spell")
CLIENT_FAULTS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                 grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 grpc.StatusCode.UNIMPLEMENTED}
SLOW_S = 5.0
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        service_pb2_grpc.GRPCInferenceServiceStub]:
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default models are not prepared: run `make prepare` (make test does)")
    repository: Path = tmp_path_factory.mktemp("grpc-malformed")
    for name in MODELS:
        (repository / name).symlink_to(REPOSITORY / name)
    address = f"127.0.0.1:{free_port()}"
    server = start_server(repository, repository / "server.log", "--grpc", address,
                          "--max-items", "64")
    channel = grpc.insecure_channel(address)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()
    log = server.log_text()
    stop_server(server)
    assert "Traceback" not in log, log[-3000:]


def bytes_elements(values: list[bytes]) -> bytes:
    """BYTES as raw_input_contents carries them: each element 4-byte little-endian length, then
    its bytes."""
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


texts = st.lists(st.binary(max_size=24) | st.text(max_size=24).map(str.encode), max_size=6)
parameter_values = st.one_of(
    st.integers(min_value=-2**63, max_value=2**63 - 1).map(
        lambda v: service_pb2.InferParameter(int64_param=v)),
    st.booleans().map(lambda v: service_pb2.InferParameter(bool_param=v)),
    st.text(max_size=12).map(lambda v: service_pb2.InferParameter(string_param=v)),
    st.floats(allow_nan=True).map(lambda v: service_pb2.InferParameter(double_param=v)),
    st.just(service_pb2.InferParameter()))
parameter_maps = st.dictionaries(
    st.sampled_from(["timeout", "top_k", "threshold", "k", "classification",
                     "binary_data_output", "catalog", "spell", "x"]), parameter_values,
    max_size=3)


@st.composite
def tensors(draw: st.DrawFn) -> service_pb2.ModelInferRequest.InferInputTensor:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name=draw(st.sampled_from(["text", "text_pair", "query", "input_ids", "", "é"])),
        datatype=draw(st.sampled_from(["BYTES", "FP32", "INT64", "INT8", "BOOL", "FP16",
                                       "bytes", ""])),
        shape=draw(st.lists(st.integers(min_value=-2, max_value=8), max_size=3)))
    kind = draw(st.sampled_from(["bytes", "fp32", "int64", "bool", "none"]))
    if kind == "bytes":
        tensor.contents.bytes_contents.extend(draw(texts))
    elif kind == "fp32":
        tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=6)))
    elif kind == "int64":
        tensor.contents.int64_contents.extend(draw(st.lists(
            st.integers(min_value=-2**63, max_value=2**63 - 1), max_size=6)))
    elif kind == "bool":
        tensor.contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=6)))
    return tensor


INPUTS = {"embed": ("text",), "intent": ("text",), "duplicates": ("text", "text_pair"),
          "spell": ("text",)}
OUTPUTS = {"embed": ("embedding",), "intent": ("probabilities",),
           "duplicates": ("probability",), "spell": ("generated_text", "score")}


@st.composite
def valid_requests(draw: st.DrawFn) -> service_pb2.ModelInferRequest:
    """A request the model answers: its inputs, BYTES of shape [n, 1], typed or raw."""
    model = draw(st.sampled_from(MODELS))
    rows = draw(st.lists(st.text(min_size=1, max_size=24).filter(str.strip), min_size=1,
                         max_size=4))
    raw = draw(st.booleans())
    request = service_pb2.ModelInferRequest(model_name=model)
    for name in INPUTS[model]:
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[len(rows), 1])
        values = [row.encode() for row in rows]
        if raw:
            request.raw_input_contents.append(bytes_elements(values))
        else:
            tensor.contents.bytes_contents.extend(values)
    if draw(st.booleans()):
        request.outputs.add(name=draw(st.sampled_from(OUTPUTS[model])))
    return request


@st.composite
def infer_requests(draw: st.DrawFn) -> service_pb2.ModelInferRequest:
    """A valid request with one to three of its parts replaced by something generated."""
    request = draw(valid_requests())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        part = draw(st.sampled_from(["model", "version", "tensor", "add tensor",
                                     "drop tensor", "raw", "parameters", "output",
                                     "output parameters", "shape", "datatype"]))
        if part == "model":
            request.model_name = draw(st.sampled_from([*MODELS, "search", "nope", "", "../x"]))
        elif part == "version":
            request.model_version = draw(st.sampled_from(["1", "2", "x", "-1"]))
        elif part == "tensor" and request.inputs:
            i = draw(st.integers(min_value=0, max_value=len(request.inputs) - 1))
            request.inputs[i].CopyFrom(draw(tensors()))
        elif part == "add tensor":
            request.inputs.append(draw(tensors()))
        elif part == "drop tensor" and request.inputs:
            del request.inputs[-1]
        elif part == "raw":
            del request.raw_input_contents[:]
            for _ in range(draw(st.integers(min_value=0, max_value=3))):
                request.raw_input_contents.append(
                    draw(texts.map(bytes_elements) | st.binary(max_size=40)))
        elif part == "parameters":
            for name, value in draw(parameter_maps).items():
                request.parameters[name].CopyFrom(value)
        elif part == "output":
            request.outputs.add(name=draw(st.sampled_from(
                ["embedding", "probabilities", "probability", "generated_text", "x", ""])))
        elif part == "output parameters" and request.outputs:
            for name, value in draw(parameter_maps).items():
                request.outputs[0].parameters[name].CopyFrom(value)
        elif part == "shape" and request.inputs:
            del request.inputs[0].shape[:]
            request.inputs[0].shape.extend(
                draw(st.lists(st.integers(min_value=-2, max_value=2**40), max_size=3)))
        elif part == "datatype" and request.inputs:
            request.inputs[0].datatype = draw(st.sampled_from(
                ["FP32", "INT64", "INT8", "BOOL", "FP16", "bytes", "", "UINT64"]))
    return request


def infer(stub: service_pb2_grpc.GRPCInferenceServiceStub,
          request: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    try:
        stub.ModelInfer(request, timeout=30)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""


@FUZZ
@given(request=infer_requests())
def test_any_infer_request_gets_ok_or_a_client_fault(
        stub: service_pb2_grpc.GRPCInferenceServiceStub,
        request: service_pb2.ModelInferRequest) -> None:
    started = time.monotonic()
    code, details = infer(stub, request)
    # A `timeout` parameter is the client's own deadline in the queue: one of a microsecond
    # is answered UNAVAILABLE, "waited in the queue past its timeout", as Triton does.
    own_deadline = "timeout" in request.parameters and "past its timeout" in details
    assert code in CLIENT_FAULTS or (code == grpc.StatusCode.UNAVAILABLE and own_deadline), (
        code, details, request)
    assert code == grpc.StatusCode.OK or details, "an error names what is wrong"
    assert "Traceback" not in details and "internal" not in details.lower()
    assert time.monotonic() - started < SLOW_S


def test_a_good_request_is_answered_after_the_malformed_ones(
        stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="embed")
    request.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(bytes_elements([b"play some jazz"]))
    answer = stub.ModelInfer(request, timeout=30)
    vector = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-3
