"""KServe v2 over HTTP: the JSON body, and the binary tensor extension, whose body is a JSON
header of `Inference-Header-Content-Length` bytes followed by the raw tensors in input order.

Only the wire format is here: the body is read into the protocol's parts (`kserve.TensorPart`,
`kserve.OutputPart`), from which `kserve.infer_request` builds the request, as it does for
gRPC; what a tensor must be, the outputs asked for and the classification extension are that
shared core's.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from queryserve.api import as_json
from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.server.http_types import check_uncompressed
from queryserve.server.kserve import (
    InferAnswer,
    InferRequest,
    InputValues,
    OutputPart,
    TensorPart,
    flag,
    infer_request,
    numbers,
    raw_bytes,
)

HEADER_LENGTH = "inference-header-content-length"


def decode_infer_request(body: bytes, headers: dict[str, str], config: ModelConfig,
                         max_items: int | None = None) -> InferRequest:
    check_uncompressed(headers)
    header_length = headers.get(HEADER_LENGTH)
    if header_length is not None:
        # isdigit() alone admits digits int() refuses ('²'): ASCII digits only.
        header_length = header_length.strip(" \t")  # a field value's optional whitespace
        if not (header_length.isascii() and header_length.isdigit()) \
                or int(header_length) > len(body):
            raise InvalidInput(f"{HEADER_LENGTH} is {header_length[:40]!r}, but the body has "
                               f"{len(body)} bytes")
        split = int(header_length)
        header, binary = parse_json(body[:split]), memoryview(body)[split:]
    else:
        header, binary = parse_json(body), memoryview(b"")
    if not isinstance(header, dict):
        raise InvalidInput("the request body must be a JSON object with 'inputs'")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    parts = _tensor_parts(raw_inputs, binary)
    parameters = _parameters(header.get("parameters"), "parameters")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"'id' must be a string, got {str(request_id)[:40]}")
    return infer_request(config, parts, _output_parts(header.get("outputs")), parameters,
                         id=request_id,
                         binary_default=flag(parameters, "binary_data_output", False,
                                             "parameters"),
                         read_data=_from_json, max_items=max_items)


def parse_json(data: bytes | memoryview) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc}") from None


def _parameters(raw: object, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"'{where}' must be an object")
    return raw


def _tensor_parts(raw_inputs: list[Any], binary: memoryview) -> list[TensorPart]:
    """Each JSON input as a part, its raw bytes cut from the binary data (`binary_data_size`,
    in input order), every byte of which some input must claim."""
    parts = []
    offset = 0
    for i, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            raise InvalidInput(f"inputs[{i}] must be an object with name, shape, datatype and "
                               "data")
        given = raw.get("parameters")
        given = {} if given is None else _parameters(given, f"inputs[{i}].parameters")
        size = given.get("binary_data_size")
        chunk = None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 \
                    or offset + size > len(binary):
                raise InvalidInput(f"inputs[{i}]: binary_data_size {as_json(size)} does not "
                                   "fit the body")
            if raw.get("data") is not None:  # as gRPC refuses contents beside raw contents
                raise InvalidInput(f"inputs[{i}] has both data and binary_data_size; send "
                                   "it one way")
            chunk, offset = binary[offset: offset + size], offset + size
        parts.append(TensorPart(raw.get("name"), raw.get("datatype"), raw.get("shape"), chunk,
                                raw.get("data"), given))
    if offset != len(binary):
        raise InvalidInput(f"the body has {len(binary) - offset} bytes of binary data that no "
                           "input claims in 'binary_data_size'")
    return parts


def _flatten(data: object, depth: int, where: str) -> list[Any]:
    """The elements of JSON data given flat or nested as the shape (row-major), nested at most
    `depth` deep; walked without recursion, so no nesting can exhaust the stack."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(item, list) for item in data):
        return data  # given flat, as Triton's clients send it: nothing to walk
    flat: list[Any] = []
    stack: list[tuple[list[Any], int, int]] = [(data, 0, 1)]  # (list, next index, its depth)
    while stack:
        items, i, level = stack.pop()
        while i < len(items):
            item = items[i]
            i += 1
            if isinstance(item, list):
                if level >= depth:
                    raise InvalidInput(f"{where}: data is nested deeper than its shape")
                stack.append((items, i, level))
                items, i, level = item, 0, level + 1
            else:
                flat.append(item)
    return flat


def _from_json(data: object, datatype: str, shape: list[int], where: str) -> InputValues:
    if data is None:
        raise InvalidInput(f"{where} has no 'data' and no binary_data_size")
    count = math.prod(shape)
    flat = _flatten(data, len(shape), where)
    if len(flat) != count:
        raise InvalidInput(f"{where} has {len(flat)} elements of data; its shape says {count}")
    if datatype == "BYTES":
        return flat
    if not all(isinstance(v, int | float) for v in flat):
        raise InvalidInput(f"{where}: data is not all {datatype} numbers")
    return numbers(flat, datatype, where)


def _output_parts(raw: object) -> list[OutputPart]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list of {name, parameters}")
    return [OutputPart(item.get("name"),
                       _parameters(item.get("parameters"), f"outputs[{i}].parameters"))
            if isinstance(item, dict) else OutputPart(None, {})
            for i, item in enumerate(raw)]


def encode_infer_response(answer: InferAnswer) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary outputs follow it."""
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in answer.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                 "shape": list(tensor.array.shape)}
        if tensor.binary:
            blob = raw_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif tensor.datatype == "BYTES":
            entry["data"] = tensor.array.ravel().tolist()
        else:
            entry["data"] = tensor.array.ravel()
        described.append(entry)
    head: dict[str, Any] = {"model_name": answer.config.name,
                            "model_version": answer.version, "outputs": described}
    if answer.request.id is not None:
        head["id"] = answer.request.id
    header = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
