"""KServe v2 over gRPC: the protobuf messages to and from the protocol's shared core.

Only the wire format is here: the message is read into the protocol's parts, from which
`kserve.infer_request` builds the request, as it does for HTTP; what a tensor must be, the
request's parameters, the outputs asked for and the classification extension are that shared
core's. The metadata, configuration, statistics and repository index are the documents HTTP
answers with (`kserve_service`, `ModelRepository.index`), parsed into Triton's messages, so
the two protocols cannot disagree.

Tensor data travels either typed (`contents`, one repeated field per datatype) or raw
(`raw_input_contents`, one entry per input, in input order). Triton answers in
`raw_output_contents` when the request came raw, and so does queryserve; a typed request gets
typed outputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format

from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.server import kserve
from queryserve.server.grpc.proto import grpc_service_pb2 as pb
from queryserve.server.grpc.proto import model_config_pb2 as config_pb

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


def decode_infer_request(request: pb.ModelInferRequest, config: ModelConfig,
                         max_items: int | None = None) -> kserve.InferRequest:
    """The request, checked against the model's config, in the shared core's terms."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for "
                           f"{len(request.inputs)} inputs; send one per input, in input order")
    parts = []
    for i, tensor in enumerate(request.inputs):
        if raw and tensor.HasField("contents"):
            raise InvalidInput(f"inputs[{i}] has both contents and raw_input_contents; send "
                               "every input one way")
        parts.append(kserve.TensorPart(tensor.name, tensor.datatype, list(tensor.shape),
                                       memoryview(raw[i]) if raw else None, tensor.contents,
                                       parameters(tensor.parameters)))
    outputs = [kserve.OutputPart(output.name, parameters(output.parameters))
               for output in request.outputs]
    return kserve.infer_request(config, parts, outputs, parameters(request.parameters),
                                id=request.id or None, binary_default=bool(raw),
                                read_data=_typed_values, max_items=max_items)


def _typed_values(contents: object, datatype: str, shape: list[int],
                  where: str) -> kserve.InputValues:
    assert isinstance(contents, pb.InferTensorContents)
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidInput(f"{where}: {datatype} data has no typed contents field; send it in "
                           "raw_input_contents")
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(f"{where} has {len(values)} elements of data in {field}; its shape "
                           f"says {count}")
    return list(values) if datatype == "BYTES" else kserve.numbers(values, datatype, where)


def encode_infer_response(answer: kserve.InferAnswer) -> pb.ModelInferResponse:
    tensors = answer.outputs
    # raw_output_contents pairs with the outputs one to one, so the whole answer is raw or
    # typed: raw when the request was, or when a datatype has no typed field.
    raw = answer.request.binary_default or any(t.datatype not in CONTENTS_FIELDS
                                               for t in tensors)
    response = pb.ModelInferResponse(model_name=answer.config.name,
                                     model_version=answer.version, id=answer.request.id or "")
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


def model_metadata(document: dict[str, object]) -> pb.ModelMetadataResponse:
    return _parsed(document, pb.ModelMetadataResponse())


def model_config(document: dict[str, object]) -> pb.ModelConfigResponse:
    batching = document.get("dynamic_batching")
    if isinstance(batching, dict):
        document = {**document, "dynamic_batching": {
            k: v for k, v in batching.items() if k not in QUERYSERVE_ONLY_BATCHING}}
    return pb.ModelConfigResponse(config=_parsed(document, config_pb.ModelConfig()))


def model_statistics(entries: list[dict[str, object]]) -> pb.ModelStatisticsResponse:
    return _parsed({"model_stats": entries}, pb.ModelStatisticsResponse())


def repository_index(entries: list[dict[str, str]]) -> pb.RepositoryIndexResponse:
    return _parsed({"models": entries}, pb.RepositoryIndexResponse())
