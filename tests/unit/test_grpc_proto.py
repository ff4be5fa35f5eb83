"""The committed protocol definitions are a subset of Triton's: every message, field, enum value
and RPC they declare has Triton's name, number and type (what `tritonclient.grpc` ships), so
Triton's clients and perf_analyzer read queryserve's answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from tritonclient.grpc import service_pb2 as triton

from queryserve.server.grpc.proto import grpc_service_pb2, model_config_pb2

OURS = (grpc_service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR)


def messages() -> Iterator[Descriptor]:
    stack = [m for file in OURS for m in file.message_types_by_name.values()]
    while stack:
        message = stack.pop()
        yield message
        stack.extend(message.nested_types)


def enums() -> Iterator[EnumDescriptor]:
    for file in OURS:
        yield from file.enum_types_by_name.values()
    for message in messages():
        yield from message.enum_types


def triton_message(full_name: str) -> Descriptor:
    return triton.DESCRIPTOR.pool.FindMessageTypeByName(full_name)


@pytest.mark.parametrize("message", list(messages()), ids=lambda m: m.full_name)
def test_every_field_has_tritons_number_and_type(message: Descriptor) -> None:
    theirs = triton_message(message.full_name)
    for field in message.fields:
        twin = theirs.fields_by_name.get(field.name)
        assert twin is not None, f"{message.full_name}.{field.name} is not Triton's"
        assert (field.number, field.type, field.is_repeated) == \
            (twin.number, twin.type, twin.is_repeated), f"{message.full_name}.{field.name}"
        if field.message_type is not None:
            assert field.message_type.full_name == twin.message_type.full_name
        if field.enum_type is not None:
            assert field.enum_type.full_name == twin.enum_type.full_name
        ours_oneof = field.containing_oneof.name if field.containing_oneof else None
        assert ours_oneof == (twin.containing_oneof.name if twin.containing_oneof else None)


@pytest.mark.parametrize("enum", list(enums()), ids=lambda e: e.full_name)
def test_every_enum_value_is_tritons(enum: EnumDescriptor) -> None:
    theirs = triton.DESCRIPTOR.pool.FindEnumTypeByName(enum.full_name)
    assert {v.name: v.number for v in enum.values} == \
        {v.name: v.number for v in theirs.values}


def test_every_rpc_is_tritons() -> None:
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        twin = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == twin.input_type.full_name
        assert method.output_type.full_name == twin.output_type.full_name
        assert (method.client_streaming, method.server_streaming) == \
            (twin.client_streaming, twin.server_streaming)


def test_a_message_written_by_tritons_definitions_reads_the_same_in_ours() -> None:
    """The two definitions live in separate descriptor pools, so both load in one process."""
    sent = triton.ModelInferRequest(model_name="embed", id="7", raw_input_contents=[b"\x01"])
    sent.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    sent.parameters["timeout"].int64_param = 5
    read = grpc_service_pb2.ModelInferRequest.FromString(sent.SerializeToString())
    assert (read.model_name, read.id, list(read.inputs[0].shape)) == ("embed", "7", [1, 1])
    assert read.parameters["timeout"].int64_param == 5
