"""The KServe v2 codec alone: JSON and binary tensors in, JSON and binary tensors out."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import orjson
import pytest

from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import InvalidInput, UnsupportedMediaType
from queryserve.server.kserve import InferAnswer
from queryserve.server.kserve_json import decode_infer_request, encode_infer_response

CONFIG = ModelConfig(
    name="embed", path=Path("."), backend="fake", pipeline="text_embedding", max_batch_size=8,
    inputs=(TensorSpec("text", "BYTES", (1,)),), outputs=(TensorSpec("embedding", "FP32", (4,)),))


def body(data: object, shape: list[int], **extra: object) -> bytes:
    return orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape,
                                     "data": data}], **extra})


@pytest.mark.parametrize(("data", "shape"), [
    (["a", "b"], [2, 1]), ([["a"], ["b"]], [2, 1]), (["a", "b"], [2])])
def test_json_text_in_any_layout_triton_clients_send(data: object, shape: list[int]) -> None:
    request = decode_infer_request(body(data, shape), {}, CONFIG)
    assert request.inputs["text"] == ["a", "b"]


def test_binary_bytes_tensor_and_parameters() -> None:
    blob = b"".join(struct.pack("<I", len(t)) + t for t in (b"caf\xc3\xa9", b""))
    header = orjson.dumps({"id": "r1", "parameters": {"timeout": 2500},
                           "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1],
                                       "parameters": {"binary_data_size": len(blob)}}],
                           "outputs": [{"name": "embedding",
                                        "parameters": {"binary_data": True}}]})
    request = decode_infer_request(header + blob,
                                   {"inference-header-content-length": str(len(header))}, CONFIG)
    assert request.inputs["text"] == [b"caf\xc3\xa9", b""]
    assert request.id == "r1" and request.timeout_s == pytest.approx(0.0025)
    assert request.binary_outputs == {"embedding": True}


def test_binary_output_follows_the_json_header() -> None:
    request = decode_infer_request(body(["a"], [1, 1], parameters={"binary_data_output": True}),
                                   {}, CONFIG)
    vectors = np.arange(4, dtype=np.float32).reshape(1, 4)
    payload, header_length = encode_infer_response(InferAnswer.of(CONFIG, request,
                                                                  {"embedding": vectors}))
    assert header_length is not None
    head = orjson.loads(payload[:header_length])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(payload[header_length:], np.float32),
                                  vectors.ravel())


def test_json_output_by_default() -> None:
    request = decode_infer_request(body(["a"], [1, 1]), {}, CONFIG)
    ones = np.ones((1, 4), np.float32)
    payload, header_length = encode_infer_response(InferAnswer.of(CONFIG, request,
                                                                  {"embedding": ones}))
    assert header_length is None
    assert orjson.loads(payload)["outputs"][0] == {
        "name": "embedding", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}


GENERATOR = ModelConfig(
    name="spell", path=Path("."), backend="ctranslate2", pipeline="text2text", max_batch_size=8,
    inputs=(TensorSpec("text", "BYTES", (1,)),),
    outputs=(TensorSpec("generated_text", "BYTES", (1,)),))


@pytest.mark.parametrize("binary", [False, True])
def test_text_outputs_as_json_strings_or_length_prefixed_bytes(binary: bool) -> None:
    request = decode_infer_request(body(["a", "b"], [2, 1],
                                        parameters={"binary_data_output": binary}), {},
                                   GENERATOR)
    texts = np.array([["café"], [""]], dtype=object)
    payload, header_length = encode_infer_response(InferAnswer.of(GENERATOR, request,
                                                                  {"generated_text": texts}))
    if not binary:
        assert header_length is None
        assert orjson.loads(payload)["outputs"][0] == {
            "name": "generated_text", "datatype": "BYTES", "shape": [2, 1],
            "data": ["café", ""]}
        return
    assert header_length is not None
    blob = payload[header_length:]
    assert orjson.loads(payload[:header_length])["outputs"][0]["parameters"] == {
        "binary_data_size": len(blob)}
    assert blob == struct.pack("<I", 5) + "café".encode() + struct.pack("<I", 0)


BINARY_HEADER = (b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1,1],'
                 b'"parameters":{"binary_data_size":4}}]}')  # 97 bytes


@pytest.mark.parametrize(("raw", "headers", "message"), [
    (body(["a"], [1, 1]), {"content-encoding": "gzip"}, "compressed request bodies"),
    (body(["a"], [1, 3]), {}, "has shape [1, 3]; expected [batch, 1]"),
    (body(["a"], [0, 1]), {}, "is empty"),
    (body(["a"], [1, 1], parameters={"timeout": -1}), {}, "parameter 'timeout' is -1"),
    (body(["a"], [1, 1], outputs=[{"name": "logits"}]), {}, "has no output 'logits'"),
    (BINARY_HEADER + b"\x05\x00\x00\x00", {"inference-header-content-length": "97"},
     "binary BYTES element 0 overruns the data"),
])
def test_bad_requests_name_the_problem(raw: bytes, headers: dict[str, str], message: str) -> None:
    with pytest.raises((InvalidInput, UnsupportedMediaType)) as error:
        decode_infer_request(raw, headers, CONFIG)
    assert message in error.value.message


def test_the_item_limit_is_checked_on_the_shape_before_the_data_is_decoded() -> None:
    from queryserve.errors import PayloadTooLarge

    count = 2_000_000
    blob = struct.pack("<I", 0) * count  # 8 MB of empty BYTES elements
    header = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [count, 1],
                                       "parameters": {"binary_data_size": len(blob)}}]})
    headers = {"inference-header-content-length": str(len(header))}
    with pytest.raises(PayloadTooLarge, match=f"the request has {count} items; at most 1024"):
        decode_infer_request(header + blob, headers, CONFIG, max_items=1024)
