"""The KServe v2 / Triton inference protocol, shared by its HTTP and gRPC front ends.

What both protocols share lives here: building the request from the parts a codec read off
the wire (`infer_request`: each input tensor checked against the model's config, name,
datatype and shape, with errors that name what is wrong; raw BYTES elements, a 4-byte
little-endian length, then the bytes; the request's parameters, `timeout` and the model's
options; the requested outputs and Triton's classification extension), turning it into the
model's `Inputs` and the model's tensors into the outputs asked for, and the metadata and
configuration documents. Each protocol adds only its wire format: `kserve_json` (HTTP's JSON
body and binary tensor extension) and `grpc/codec.py` (the protobuf messages); what an
operation does with the server (`kserve_service`) is shared too.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from queryserve import __version__
from queryserve.api import Inputs, as_json, decode_texts
from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import InvalidInput, PayloadTooLarge
from queryserve.repository import VERSION
from queryserve.server.classification import PARAMETER as CLASSIFICATION
from queryserve.server.classification import classification_count, top_classes
from queryserve.types import NUMPY_DTYPES, TRITON_DATA_TYPES, Array

EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration",
              "model_repository", "statistics"]
"""The protocol extensions both front ends serve (server metadata's `extensions`)."""

InputValues = list[bytes | str] | Array
"""One input's elements, flat: texts (BYTES), or a numpy array of the declared datatype."""


class InferRequest(NamedTuple):
    """An infer request as both protocols carry it, checked (`infer_request`). It and the
    records below are named tuples: built on every request, and a frozen dataclass's
    __init__ costs several times a tuple's."""

    id: str | None
    inputs: dict[str, InputValues]
    binary_outputs: dict[str, bool]
    """Requested outputs and whether each is wanted as raw bytes; empty means all, as
    `binary_default` says (HTTP: JSON unless `binary_data_output`; gRPC: raw when the inputs
    came raw)."""
    binary_default: bool
    timeout_s: float | None
    parameters: dict[str, Any]
    """The request's `parameters`: the protocol's own (`timeout`, `binary_data_output`) and
    the model's options (`top_k`, `threshold`, `k`...), which the model reads."""
    classifications: dict[str, int]
    """Outputs asked for as Triton's classification extension: name -> how many classes."""


class OutputTensor(NamedTuple):
    """One output as the response carries it."""

    name: str
    datatype: str
    array: Array
    binary: bool


class InferAnswer(NamedTuple):
    """An infer request's answer, for its codec to encode."""

    config: ModelConfig
    request: InferRequest
    outputs: list[OutputTensor]
    """The outputs the request asked for (all, when it named none), in its order."""
    version: str = VERSION

    @classmethod
    def of(cls, config: ModelConfig, request: InferRequest,
           outputs: dict[str, Array]) -> InferAnswer:
        """The answer from the model's output tensors, by name."""
        return cls(config, request, output_tensors(config, request, outputs))


class TensorPart(NamedTuple):
    """One input tensor as a codec read it off the wire, not yet checked against the model."""

    name: object
    datatype: object
    shape: object
    raw: memoryview | None
    """Its raw bytes (HTTP's binary extension, gRPC's `raw_input_contents`); None: `data`."""
    data: object = None
    """Its elements in the codec's own form (JSON's nested lists, gRPC's typed contents), read
    by the codec's `DataReader` once the tensor is checked."""
    parameters: Mapping[str, Any] = {}
    """Its parameters, as the codec read them (`binary_data_size` already used)."""


SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
"""Triton's shared-memory parameters. This server registers no regions: a tensor that names
one is refused, rather than its output sent inline while the client reads its region."""


DataReader = Callable[[object, str, list[int], str], InputValues]
"""A codec's reading of `TensorPart.data`: (data, datatype, shape, where) -> the values; the
datatype and shape are the checked ones."""


class OutputPart(NamedTuple):
    """One requested output as a codec read it: its name and its parameters
    (`binary_data`, `classification`), not yet checked."""

    name: object
    parameters: Mapping[str, Any]


def infer_request(config: ModelConfig, parts: Sequence[TensorPart],
                  outputs: Sequence[OutputPart], parameters: dict[str, Any], *,
                  id: str | None, binary_default: bool, read_data: DataReader,
                  max_items: int | None = None) -> InferRequest:
    """The request, checked against the model's config: the one place where an infer request
    is built, whichever protocol carried it."""
    if not parts:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    inputs: dict[str, InputValues] = {}
    for i, part in enumerate(parts):
        if part.parameters:  # mostly none: no check, no message made, on the hot path
            _no_shared_memory(part.parameters, f"inputs[{i}]")
        spec = input_spec(part.name, i, config)
        where = f"input '{spec.name}'"
        count = check_tensor(spec, part.datatype, part.shape, config, where)
        assert isinstance(part.shape, list)  # check_tensor said so
        if max_items is not None and part.shape[0] > max_items:
            # On the shape, before the data is decoded: 2,000,000 empty BYTES elements in
            # 8 MB cost 0.46 s of the loop's time before the same answer came.
            raise PayloadTooLarge(f"the request has {part.shape[0]} items; at most "
                                  f"{max_items} are allowed per request (serve --max-items)")
        values = (values_from_raw(part.raw, spec.datatype, count, where) if part.raw is not None
                  else read_data(part.data, spec.datatype, part.shape, where))
        if spec.name in inputs:
            raise InvalidInput(f"inputs[{i}]: input '{spec.name}' is given twice")
        inputs[spec.name] = values
    if len(inputs) != len(config.inputs):  # each is one of the model's, none twice
        missing = sorted({spec.name for spec in config.inputs} - set(inputs))
        raise InvalidInput(f"model '{config.name}' needs input(s) {', '.join(missing)}")
    wanted: dict[str, bool] = {}
    classifications: dict[str, int] = {}
    for i, output in enumerate(outputs):
        if output.parameters:
            _no_shared_memory(output.parameters, f"outputs[{i}]")
        name, classes = requested_output(output.name, output.parameters, i, config)
        if name in wanted:  # answered once, a client reading outputs by position is misled
            raise InvalidInput(f"outputs[{i}]: output '{name}' is asked for twice")
        wanted[name] = flag(output.parameters, "binary_data", binary_default,
                            f"outputs[{i}].parameters")
        if classes is not None:
            classifications[name] = classes
    return InferRequest(id=id, inputs=inputs, binary_outputs=wanted,
                        binary_default=binary_default, timeout_s=request_timeout(parameters),
                        parameters=parameters, classifications=classifications)


def flag(parameters: Mapping[str, Any], name: str, default: bool, where: str) -> bool:
    """A true-or-false parameter; "false" (a string) is not false, so it is refused."""
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"{where}: '{name}' must be true or false, got {as_json(value, 40)}")
    return value


def _no_shared_memory(parameters: Mapping[str, Any], where: str) -> None:
    if any(name in parameters for name in SHARED_MEMORY):
        raise InvalidInput(f"{where}: shared memory is not supported by this server (it "
                           "registers no regions); send the data in the request")


def server_metadata() -> dict[str, object]:
    return {"name": "queryserve", "version": __version__, "extensions": EXTENSIONS}


# -- what both protocols share ------------------------------------------------------------------


def input_spec(name: object, i: int, config: ModelConfig) -> TensorSpec:
    """The model's input that `inputs[i]` names."""
    for spec in config.inputs:  # a loop, not next(generator): this runs on every request
        if spec.name == name:
            return spec
    raise InvalidInput(f"inputs[{i}]: model '{config.name}' has no input "
                       f"{str(name)[:80]!r}; its inputs are "
                       f"{', '.join(s.name for s in config.inputs)}")


def check_tensor(spec: TensorSpec, datatype: object, shape: object, config: ModelConfig,
                 where: str) -> int:
    """The element count of a tensor sent as `datatype` and `shape`, checked against the
    model's input `spec`."""
    if datatype != spec.datatype:
        raise InvalidInput(f"{where} has datatype {str(datatype)[:40]!r}; expected "
                           f"{spec.datatype}")
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise InvalidInput(f"{where} has shape {str(shape)[:80]}; expected a list of sizes")
    _check_shape(shape, spec, config, where)
    return math.prod(shape)


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


def numbers(values: Any, datatype: str, where: str) -> Array:
    """Numbers as an array of `datatype`; a value it cannot hold is the client's mistake (NumPy
    would wrap an integer out of range, or truncate a fraction, without a word)."""
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    try:
        given = np.asarray(values)
        if dtype.kind in "iu" and given.size:
            limits = np.iinfo(dtype)
            if given.dtype.kind not in "iub" or given.min() < limits.min \
                    or given.max() > limits.max:
                raise ValueError(datatype)
        return given.astype(dtype)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{where}: data is not all {datatype} numbers in range") from None


def values_from_raw(chunk: memoryview, datatype: str, count: int, where: str) -> InputValues:
    """A raw tensor (HTTP's binary extension, gRPC's raw_input_contents): little-endian
    values, or BYTES elements each a 4-byte little-endian length and the bytes."""
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


def request_timeout(parameters: Mapping[str, Any]) -> float | None:
    """The `timeout` parameter (microseconds, as Triton's per-request one) in seconds."""
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise InvalidInput(f"parameter 'timeout' is {as_json(timeout)}; expected microseconds, an "
                           "integer >= 0")
    return float(timeout) / 1e6


def requested_output(name: object, parameters: Mapping[str, Any], i: int,
                     config: ModelConfig) -> tuple[str, int | None]:
    """`outputs[i]`'s name, checked, and its classification count when it asks for one."""
    known = [spec.name for spec in config.outputs]
    if not isinstance(name, str) or name not in known:  # a list or object is no name
        raise InvalidInput(f"outputs[{i}]: model '{config.name}' has no output "
                           f"{str(name)[:80]!r}; its outputs are {', '.join(sorted(known))}")
    count = parameters.get(CLASSIFICATION)
    return name, None if count is None else classification_count(count, name, config)


def model_inputs(request: InferRequest, config: ModelConfig) -> Inputs:
    """The model's `Inputs`: the first input's texts, and the second's for a model that takes
    pairs (same count)."""
    specs = config.inputs
    raw = request.inputs[specs[0].name]
    texts = decode_texts(list(raw), f"input '{specs[0].name}'")
    pairs = None
    if len(specs) > 1:
        pairs = decode_texts(list(request.inputs[specs[1].name]), f"input '{specs[1].name}'")
        if len(pairs) != len(texts):
            raise InvalidInput(
                f"inputs '{specs[0].name}' and '{specs[1].name}' must hold the same number of "
                f"texts; got {len(texts)} and {len(pairs)}")
    return Inputs(texts, pairs, request.parameters, request.timeout_s)


def output_tensors(config: ModelConfig, request: InferRequest,
                   outputs: dict[str, Array]) -> list[OutputTensor]:
    """The outputs the request asked for (all, when it named none), in its order, each with
    its datatype; an output asked for as classes becomes its top classes."""
    wanted = request.binary_outputs or dict.fromkeys(outputs, request.binary_default)
    tensors = []
    for name, binary in wanted.items():
        array = outputs[name]
        count = request.classifications.get(name)
        if count is not None:
            labels = config.labels(math.prod(array.shape[1:]))
            tensors.append(OutputTensor(name, "BYTES", top_classes(array, count, labels), binary))
        else:
            datatype = next(s.datatype for s in config.outputs if s.name == name)
            tensors.append(OutputTensor(name, datatype, array, binary))
    return tensors


def raw_bytes(tensor: OutputTensor) -> bytes:
    """An output as raw bytes: little-endian values, or BYTES elements each a 4-byte
    little-endian length and the UTF-8 bytes."""
    if tensor.datatype != "BYTES":
        return np.ascontiguousarray(tensor.array).tobytes()
    parts = []
    for item in tensor.array.ravel():
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


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
