"""The KServe v2 / Triton inference protocol: JSON tensors and the binary tensor extension.

Decoding checks every input against the model's config (name, datatype, shape) and names what
is wrong; encoding writes each output as JSON or raw bytes, as the request asked.
Binary extension: the body is a JSON header of `Inference-Header-Content-Length` bytes followed
by the raw tensors in input order; BYTES elements are each a 4-byte little-endian length and
the bytes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import InvalidInput, UnsupportedMediaType
from queryserve.types import NUMPY_DTYPES, TRITON_DATA_TYPES, Array

HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    inputs: dict[str, list[bytes | str] | Array]
    binary_outputs: dict[str, bool]
    """Requested outputs and whether each is wanted as raw bytes; empty means all, as JSON."""
    binary_default: bool
    timeout_s: float | None
    parameters: dict[str, Any]
    """The request's `parameters`: the protocol's own (`timeout`, `binary_data_output`) and
    the model's options (`top_k`, `threshold`, `k`...), which the model reads."""


def decode_infer_request(body: bytes, headers: dict[str, str],
                         config: ModelConfig) -> InferRequest:
    if headers.get("content-encoding", "identity") not in ("identity", ""):
        raise UnsupportedMediaType("compressed request bodies are not supported; "
                                   "send them uncompressed")
    header_length = headers.get(HEADER_LENGTH)
    if header_length is not None:
        # isdigit() alone admits digits int() refuses ('²'): ASCII digits only.
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
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    specs = {spec.name: spec for spec in config.inputs}
    inputs: dict[str, list[bytes | str] | Array] = {}
    offset = 0
    for i, raw in enumerate(raw_inputs):
        tensor, offset = _decode_input(raw, i, specs, config, binary, offset)
        if tensor[0] in inputs:
            raise InvalidInput(f"inputs[{i}]: input '{tensor[0]}' is given twice")
        inputs[tensor[0]] = tensor[1]
    missing = sorted(set(specs) - set(inputs))
    if missing:
        raise InvalidInput(f"model '{config.name}' needs input(s) {', '.join(missing)}")
    if offset != len(binary):
        raise InvalidInput(f"the body has {len(binary) - offset} bytes of binary data that no "
                           "input claims in 'binary_data_size'")
    parameters = _parameters(header.get("parameters"), "parameters")
    binary_default = bool(parameters.get("binary_data_output", False))
    return InferRequest(
        id=str(header["id"]) if header.get("id") is not None else None,
        inputs=inputs,
        binary_outputs=_requested_outputs(header.get("outputs"), config, binary_default),
        binary_default=binary_default,
        timeout_s=_timeout(parameters),
        parameters=parameters,
    )


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


def _timeout(parameters: dict[str, Any]) -> float | None:
    timeout = parameters.get("timeout")  # microseconds, as Triton's per-request parameter
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise InvalidInput(f"parameter 'timeout' is {timeout!r}; expected microseconds, an "
                           "integer >= 0")
    return float(timeout) / 1e6


def _decode_input(raw: object, i: int, specs: dict[str, TensorSpec], config: ModelConfig,
                  binary: memoryview, offset: int,
                  ) -> tuple[tuple[str, list[bytes | str] | Array], int]:
    where = f"inputs[{i}]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where} must be an object with name, shape, datatype and data")
    name = raw.get("name")
    spec = specs.get(name) if isinstance(name, str) else None
    if spec is None:
        raise InvalidInput(f"{where}: model '{config.name}' has no input {str(name)[:80]!r}; "
                           f"its inputs are {', '.join(specs)}")
    where = f"input '{spec.name}'"
    if raw.get("datatype") != spec.datatype:
        raise InvalidInput(f"{where} has datatype {str(raw.get('datatype'))[:40]!r}; expected "
                           f"{spec.datatype}")
    shape = raw.get("shape")
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise InvalidInput(f"{where} has shape {str(shape)[:80]}; expected a list of sizes")
    _check_shape(shape, spec, config, where)
    count = math.prod(shape)
    size = _parameters(raw.get("parameters"), f"{where}.parameters").get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise InvalidInput(f"{where}: binary_data_size {size!r} does not fit the body")
        chunk = binary[offset: offset + size]
        return (spec.name, _from_binary(chunk, spec.datatype, count, where)), offset + size
    if "data" not in raw:
        raise InvalidInput(f"{where} has no 'data' and no binary_data_size")
    return (spec.name, _from_json(raw["data"], spec.datatype, shape, where)), offset


def _check_shape(shape: list[int], spec: TensorSpec, config: ModelConfig, where: str) -> None:
    """Accept [batch, *dims] (Triton) and, for one-element dims, plain [batch]."""
    dims = list(spec.dims)
    trailing = shape[1:]
    matches = len(trailing) == len(dims) and all(
        d == -1 or d == s for d, s in zip(dims, trailing, strict=True))
    if not matches and not (dims == [1] and not trailing):
        expected = ", ".join(["batch", *("-1" if d == -1 else str(d) for d in dims)])
        raise InvalidInput(f"{where} has shape {str(shape)[:80]}; expected [{expected}]")
    if shape[0] == 0:
        raise InvalidInput(f"{where} is empty; send at least one item")


def _flatten(data: object, depth: int, where: str) -> list[Any]:
    """The elements of JSON data given flat or nested as the shape (row-major), nested at most
    `depth` deep; walked without recursion, so no nesting can exhaust the stack."""
    if not isinstance(data, list):
        return [data]
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


def _from_json(data: object, datatype: str, shape: list[int],
               where: str) -> list[bytes | str] | Array:
    count = math.prod(shape)
    flat = _flatten(data, len(shape), where)
    if len(flat) != count:
        raise InvalidInput(f"{where} has {len(flat)} elements of data; its shape says {count}")
    if datatype == "BYTES":
        return flat
    if not all(isinstance(v, int | float) for v in flat):
        raise InvalidInput(f"{where}: data is not all {datatype} numbers")
    try:
        return np.asarray(flat, dtype=NUMPY_DTYPES[datatype])
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{where}: data is not all {datatype} numbers in range") from None


def _from_binary(chunk: memoryview, datatype: str, count: int,
                 where: str) -> list[bytes | str] | Array:
    if datatype != "BYTES":
        dtype = np.dtype(NUMPY_DTYPES[datatype])
        if len(chunk) != count * dtype.itemsize:
            raise InvalidInput(f"{where}: {len(chunk)} bytes of binary data do not hold {count} "
                               f"{datatype} values")
        return np.frombuffer(chunk, dtype=dtype)
    items: list[bytes | str] = []
    position = 0
    for _ in range(count):
        if position + 4 > len(chunk):
            raise InvalidInput(f"{where}: binary BYTES data ends before element {len(items)}")
        (length,) = struct.unpack_from("<I", chunk, position)
        position += 4
        if position + length > len(chunk):
            raise InvalidInput(f"{where}: binary BYTES element {len(items)} overruns the data")
        items.append(bytes(chunk[position: position + length]))
        position += length
    if position != len(chunk):
        raise InvalidInput(f"{where}: binary data holds more than the {count} elements its "
                           "shape says")
    return items


def _requested_outputs(raw: object, config: ModelConfig,
                       binary_default: bool) -> dict[str, bool]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list of {name, parameters}")
    known = {spec.name for spec in config.outputs}
    wanted: dict[str, bool] = {}
    for i, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or name not in known:  # a list or object is no name
            raise InvalidInput(f"outputs[{i}]: model '{config.name}' has no output "
                               f"{str(name)[:80]!r}; its outputs are {', '.join(sorted(known))}")
        assert isinstance(item, dict)
        parameters = _parameters(item.get("parameters"), f"outputs[{i}].parameters")
        wanted[name] = bool(parameters.get("binary_data", binary_default))
    return wanted


def _bytes_blob(array: Array) -> bytes:
    """BYTES elements as the binary extension lays them out: a 4-byte little-endian length,
    then the UTF-8 bytes, for each element in order."""
    parts = []
    for item in array.ravel():
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def encode_infer_response(config: ModelConfig, version: str, request: InferRequest,
                          outputs: dict[str, Array]) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary outputs follow it."""
    wanted = request.binary_outputs or dict.fromkeys(outputs, request.binary_default)
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, as_binary in wanted.items():
        array = outputs[name]
        spec = next(s for s in config.outputs if s.name == name)
        entry: dict[str, Any] = {"name": name, "datatype": spec.datatype,
                                 "shape": list(array.shape)}
        if as_binary:
            blob = (_bytes_blob(array) if spec.datatype == "BYTES"
                    else np.ascontiguousarray(array).tobytes())
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.ravel().tolist() if spec.datatype == "BYTES" else array.ravel()
        described.append(entry)
    head: dict[str, Any] = {"model_name": config.name, "model_version": version,
                            "outputs": described}
    if request.id is not None:
        head["id"] = request.id
    header = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


# -- model metadata and configuration -----------------------------------------------------------


def model_metadata(config: ModelConfig, version: str) -> dict[str, object]:
    def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, object]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": [-1, *s.dims]} for s in specs]

    return {"name": config.name, "versions": [version], "platform": _platform(config),
            "inputs": tensors(config.inputs), "outputs": tensors(config.outputs)}


def _platform(config: ModelConfig) -> str:
    return "onnxruntime_onnx" if config.backend == "onnxruntime" else config.backend


def triton_config(config: ModelConfig, threads: int) -> dict[str, object]:
    """The model's configuration in Triton's JSON form (perf_analyzer reads it); an ensemble's
    lists its steps, as Triton's `ensemble_scheduling` does."""
    def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, object]]:
        return [{"name": s.name, "data_type": TRITON_DATA_TYPES[s.datatype], "dims": list(s.dims)}
                for s in specs]

    common: dict[str, object] = {
        "name": config.name,
        "platform": _platform(config),
        "max_batch_size": config.max_batch_size,
        "input": tensors(config.inputs),
        "output": tensors(config.outputs),
    }
    if config.ensemble is not None:
        return {**common, "ensemble_scheduling": {"step": [
            {"model_name": m, "model_version": -1} for m in config.ensemble.models()]}}
    batching = config.dynamic_batching
    return {
        **common,
        "backend": config.backend,
        "dynamic_batching": {
            "preferred_batch_size": list(batching.preferred_batch_size),
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "default_queue_policy": {
                "max_queue_size": batching.max_queue_size,
                "default_timeout_microseconds": batching.default_timeout_microseconds,
            },
            "max_batch_tokens": batching.max_batch_tokens,
            "batch_overhead_tokens": batching.batch_overhead_tokens,
        },
        "instance_group": [{"count": config.instance_group.count, "kind": "KIND_CPU"}],
        "response_cache": {"enable": config.response_cache.enable},
        "parameters": {**{k: {"string_value": str(v)} for k, v in config.parameters.items()},
                       "intra_op_thread_count": {"string_value": str(threads)}},
        "model_warmup": [{"name": w.name, "batch_size": w.batch_size}
                         for w in config.model_warmup],
    }
