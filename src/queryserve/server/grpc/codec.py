"""KServe v2 over gRPC: the protobuf messages to and from the protocol's shared core.

Only the wire format is here. What a tensor must be, the request's parameters, the outputs
asked for and the classification extension come from `kserve.py`, as they do for HTTP; the
metadata, configuration, statistics and repository index are the documents HTTP answers with
(`kserve.model_metadata`, `kserve.triton_config`, `ModelStats.as_triton_json`,
`ModelRepository.index`), parsed into Triton's messages, so the two protocols cannot disagree.

Tensor data travels either typed (`contents`, one repeated field per datatype) or raw
(`raw_input_contents`, one entry per input, in input order). Triton answers in
`raw_output_contents` when the request came raw, and so does queryserve; a typed request gets
typed outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format

from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.server import kserve
from queryserve.server.grpc.proto import grpc_service_pb2 as pb
from queryserve.server.grpc.proto import model_config_pb2 as config_pb
from queryserve.types import Array

CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""Where `InferTensorContents` holds each datatype; FP16 and BF16 travel raw only."""

QUERYSERVE_ONLY_BATCHING = ("max_batch_tokens", "batch_overhead_tokens")
"""`dynamic_batching` fields of queryserve's own: Triton's message has no number for them."""

Message = TypeVar("Message")


def parameters(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A `map<string, InferParameter>` (or `ModelRepositoryParameter`: the same oneof) as the
    plain values HTTP's JSON would carry."""
    values: dict[str, Any] = {}
    for name, parameter in fields.items():
        choice = parameter.WhichOneof("parameter_choice")
        values[name] = None if choice is None else getattr(parameter, choice)
    return values


def decode_infer_request(request: pb.ModelInferRequest,
                         config: ModelConfig) -> kserve.InferRequest:
    """The request, checked against the model's config, in the shared core's terms."""
    if not request.inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for "
                           f"{len(request.inputs)} inputs; send one per input, in input order")
    inputs: dict[str, kserve.InputValues] = {}
    for i, tensor in enumerate(request.inputs):
        spec = kserve.input_spec(tensor.name, i, config)
        where = f"input '{spec.name}'"
        count = kserve.check_tensor(spec, tensor.datatype, list(tensor.shape), config, where)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"{where} has both contents and raw_input_contents; send "
                                   "every input one way")
            values = kserve.values_from_raw(memoryview(raw[i]), spec.datatype, count, where)
        else:
            values = _typed_values(tensor.contents, spec.datatype, count, where)
        kserve.add_input(inputs, spec.name, values, i)
    kserve.check_inputs_complete(inputs, config)
    options = parameters(request.parameters)
    wanted: dict[str, bool] = {}
    classifications: dict[str, int] = {}
    for i, output in enumerate(request.outputs):
        name, classes = kserve.requested_output(output.name, parameters(output.parameters), i,
                                                config)
        wanted[name] = bool(raw)
        if classes is not None:
            classifications[name] = classes
    return kserve.InferRequest(id=request.id or None, inputs=inputs, binary_outputs=wanted,
                               binary_default=bool(raw), timeout_s=kserve.request_timeout(options),
                               parameters=options, classifications=classifications)


def _typed_values(contents: pb.InferTensorContents, datatype: str, count: int,
                  where: str) -> kserve.InputValues:
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidInput(f"{where}: {datatype} data has no typed contents field; send it in "
                           "raw_input_contents")
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidInput(f"{where} has {len(values)} elements of data in {field}; its shape "
                           f"says {count}")
    return list(values) if datatype == "BYTES" else kserve.numbers(values, datatype, where)


def encode_infer_response(config: ModelConfig, version: str, request: kserve.InferRequest,
                          outputs: dict[str, Array]) -> pb.ModelInferResponse:
    tensors = kserve.output_tensors(config, request, outputs)
    # raw_output_contents pairs with the outputs one to one, so the whole answer is raw or
    # typed: raw when the request was, or when a datatype has no typed field.
    raw = request.binary_default or any(t.datatype not in CONTENTS_FIELDS for t in tensors)
    response = pb.ModelInferResponse(model_name=config.name, model_version=version,
                                     id=request.id or "")
    for tensor in tensors:
        entry = response.outputs.add(name=tensor.name, datatype=tensor.datatype,
                                     shape=tensor.array.shape)
        if raw:
            response.raw_output_contents.append(kserve.raw_bytes(tensor))
        elif tensor.datatype == "BYTES":
            entry.contents.bytes_contents.extend(
                item.encode() if isinstance(item, str) else bytes(item)
                for item in tensor.array.ravel())
        else:
            getattr(entry.contents, CONTENTS_FIELDS[tensor.datatype]).extend(
                tensor.array.ravel().tolist())
    return response


# -- documents: the same data HTTP answers with, as Triton's messages ---------------------------


def _parsed(document: Mapping[str, object], message: Message) -> Message:
    """`message` filled from a JSON document; a field the message lacks is an error (a bug
    here, never the client's), not silently dropped."""
    json_format.ParseDict(document, message)
    return message


def server_metadata() -> pb.ServerMetadataResponse:
    return _parsed(kserve.server_metadata(), pb.ServerMetadataResponse())


def model_metadata(config: ModelConfig, version: str) -> pb.ModelMetadataResponse:
    return _parsed(kserve.model_metadata(config, version), pb.ModelMetadataResponse())


def model_config(config: ModelConfig, threads: int) -> pb.ModelConfigResponse:
    document = kserve.triton_config(config, threads)
    batching = document.get("dynamic_batching")
    if isinstance(batching, dict):
        document["dynamic_batching"] = {k: v for k, v in batching.items()
                                        if k not in QUERYSERVE_ONLY_BATCHING}
    return pb.ModelConfigResponse(config=_parsed(document, config_pb.ModelConfig()))


def model_statistics(entries: list[dict[str, object]]) -> pb.ModelStatisticsResponse:
    return _parsed({"model_stats": entries}, pb.ModelStatisticsResponse())


def repository_index(entries: list[dict[str, str]], ready_only: bool,
                     ) -> pb.RepositoryIndexResponse:
    models = [e for e in entries if e["state"] == "READY"] if ready_only else entries
    return _parsed({"models": models}, pb.RepositoryIndexResponse())
