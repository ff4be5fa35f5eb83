"""Triton's classification extension in the shared codec, seen through HTTP's JSON body."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import orjson
import pytest

from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import InvalidInput
from queryserve.server.classification import top_classes
from queryserve.server.kserve import InferAnswer
from queryserve.server.kserve_json import decode_infer_request, encode_infer_response

INTENT = ModelConfig(
    name="intent", path=Path("."), backend="fake", pipeline="text_classification",
    max_batch_size=8, inputs=(TensorSpec("text", "BYTES", (1,)),),
    outputs=(TensorSpec("probabilities", "FP32", (3,)),),
    parameters={"labels": "alarm,music,weather"})
SCORES = np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]], dtype=np.float32)


def body(outputs: list[dict[str, object]], **parameters: object) -> bytes:
    return orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1],
                                     "data": ["a", "b"]}],
                         "outputs": outputs, "parameters": parameters})


def test_top_classes_as_triton_prints_them() -> None:
    classes = top_classes(SCORES, 2, ["alarm", "music", "weather"])
    assert classes.tolist() == [["0.600000:1:music", "0.300000:2:weather"],
                                ["0.500000:0:alarm", "0.250000:1:music"]]  # a tie: lower first
    assert top_classes(SCORES, 10, ["a", "b", "c"]).shape == (2, 3)  # k past the classes: all


@pytest.mark.parametrize("binary", [False, True])
def test_a_classification_output_is_bytes_json_or_binary(binary: bool) -> None:
    request = decode_infer_request(body([{"name": "probabilities", "parameters": {
        "classification": 1, "binary_data": binary}}]), {}, INTENT)
    assert request.classifications == {"probabilities": 1}
    payload, header_length = encode_infer_response(InferAnswer.of(INTENT, request,
                                                                  {"probabilities": SCORES}))
    head = orjson.loads(payload[:header_length] if header_length else payload)
    output = head["outputs"][0]
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 1])
    if not binary:
        assert output["data"] == ["0.600000:1:music", "0.500000:0:alarm"]
    else:
        first = b"0.600000:1:music"
        assert payload[header_length:].startswith(struct.pack("<I", len(first)) + first)


@pytest.mark.parametrize(("config", "count", "message"), [
    (INTENT, 0, "parameter 'classification' is 0"),
    (INTENT, "2", 'parameter \'classification\' is "2"'),
    (INTENT, True, "parameter 'classification' is true"),
    (ModelConfig(name="embed", path=Path("."), backend="fake", pipeline="text_embedding",
                 max_batch_size=8, inputs=INTENT.inputs,
                 outputs=(TensorSpec("probabilities", "FP32", (3,)),)),
     1, "model 'embed' is a text_embedding model"),
])
def test_a_bad_classification_is_invalid(config: ModelConfig, count: object,
                                         message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_infer_request(body([{"name": "probabilities",
                                    "parameters": {"classification": count}}]), {}, config)
