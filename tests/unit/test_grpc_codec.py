"""The gRPC codec and service alone: protobuf messages to and from the shared KServe core, and
what every RPC goes through (the API key, the one error mapping), with a fake context."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import numpy as np
import pytest

from queryserve.config import DynamicBatching, ModelConfig, SearchSteps, TensorSpec
from queryserve.errors import InvalidInput, Unavailable
from queryserve.repository import ModelRepository
from queryserve.server import kserve
from queryserve.server.grpc import codec
from queryserve.server.grpc.proto import grpc_service_pb2 as pb
from queryserve.server.grpc.proto import model_config_pb2
from queryserve.server.grpc.service import InferenceService
from queryserve.server.kserve import InferAnswer
from queryserve.server.security import AccessControl
from queryserve.server.state import ServerState

EMBED = ModelConfig(
    name="embed", path=Path("."), backend="fake", pipeline="text_embedding", max_batch_size=8,
    inputs=(TensorSpec("text", "BYTES", (1,)),), outputs=(TensorSpec("embedding", "FP32", (4,)),),
    dynamic_batching=DynamicBatching(max_batch_tokens=512, batch_overhead_tokens=4))
NUMBERS = ModelConfig(
    name="numbers", path=Path("."), backend="fake", pipeline="text_embedding", max_batch_size=8,
    inputs=(TensorSpec("ids", "INT8", (-1,)),), outputs=(TensorSpec("half", "FP16", (2,)),))
INTENT = ModelConfig(
    name="intent", path=Path("."), backend="fake", pipeline="text_classification",
    max_batch_size=8, inputs=(TensorSpec("text", "BYTES", (1,)),),
    outputs=(TensorSpec("probabilities", "FP32", (3,)),),
    parameters={"labels": "alarm,music,weather"})


def request(model: str = "embed", **extra: object) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name=model, **extra)  # type: ignore[arg-type]


def test_raw_and_typed_bytes_inputs_decode_alike() -> None:
    raw = request(raw_input_contents=[b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"])
    raw.inputs.add(name="text", datatype="BYTES", shape=[2, 1])
    typed = request(id="r1")
    typed.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [b"a", b"bc"])
    typed.parameters["timeout"].int64_param = 2500
    typed.parameters["top_k"].int64_param = 3
    from_raw, from_typed = (codec.decode_infer_request(r, EMBED) for r in (raw, typed))
    assert from_raw.inputs == from_typed.inputs == {"text": [b"a", b"bc"]}
    assert from_raw.binary_default and not from_typed.binary_default
    assert from_typed.id == "r1" and from_typed.timeout_s == pytest.approx(0.0025)
    assert from_typed.parameters == {"timeout": 2500, "top_k": 3}


@pytest.mark.parametrize(("values", "message"), [
    ([1, 2, 300], "not all INT8 numbers in range"),
    ([1, 2], "has 2 elements of data in int_contents; its shape says 3"),
])
def test_typed_numbers_are_checked(values: list[int], message: str) -> None:
    bad = request("numbers")
    bad.inputs.add(name="ids", datatype="INT8", shape=[1, 3]).contents.int_contents.extend(values)
    with pytest.raises(InvalidInput, match=message):
        codec.decode_infer_request(bad, NUMBERS)


def test_mixed_raw_and_typed_inputs_are_refused() -> None:
    mixed = request(raw_input_contents=[b"\x01\x00\x00\x00a"])
    mixed.inputs.add(name="text", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(
        b"a")
    with pytest.raises(InvalidInput, match="both contents and raw_input_contents"):
        codec.decode_infer_request(mixed, EMBED)


def test_outputs_come_raw_for_a_raw_request_and_typed_for_a_typed_one() -> None:
    vectors = np.arange(8, dtype=np.float32).reshape(2, 4)
    for raw in (True, False):
        asked = request(raw_input_contents=[b"\x01\x00\x00\x00a"] if raw else [])
        tensor = asked.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
        if not raw:
            tensor.contents.bytes_contents.append(b"a")
        parsed = codec.decode_infer_request(asked, EMBED)
        answer = codec.encode_infer_response(InferAnswer.of(EMBED, parsed, {"embedding": vectors}))
        assert (answer.model_name, answer.model_version) == ("embed", "1")
        assert list(answer.outputs[0].shape) == [2, 4]
        if raw:
            assert answer.raw_output_contents == [vectors.tobytes()]
        else:
            assert list(answer.outputs[0].contents.fp32_contents) == vectors.ravel().tolist()


def test_an_output_with_no_typed_field_makes_the_answer_raw() -> None:
    asked = request("numbers")
    asked.inputs.add(name="ids", datatype="INT8", shape=[1, 1]).contents.int_contents.append(7)
    parsed = codec.decode_infer_request(asked, NUMBERS)
    half = np.ones((1, 2), dtype=np.float16)
    answer = codec.encode_infer_response(InferAnswer.of(NUMBERS, parsed, {"half": half}))
    assert answer.raw_output_contents == [half.tobytes()]


def test_classification_answers_typed_strings() -> None:
    asked = request("intent")
    asked.inputs.add(name="text", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(
        b"wake me up")
    asked.outputs.add(name="probabilities").parameters["classification"].int64_param = 2
    parsed = codec.decode_infer_request(asked, INTENT)
    scores = np.array([[0.7, 0.1, 0.2]], np.float32)
    answer = codec.encode_infer_response(InferAnswer.of(INTENT, parsed, {"probabilities": scores}))
    assert answer.outputs[0].datatype == "BYTES" and list(answer.outputs[0].shape) == [1, 2]
    assert list(answer.outputs[0].contents.bytes_contents) == [b"0.700000:0:alarm",
                                                               b"0.200000:2:weather"]


def test_config_of_a_model_and_of_an_ensemble_fit_tritons_message() -> None:
    config = codec.model_config(kserve.triton_config(EMBED, threads=2)).config
    assert (config.name, config.backend, config.max_batch_size) == ("embed", "fake", 8)
    assert config.input[0].data_type == model_config_pb2.TYPE_STRING
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 1024
    assert config.parameters["intra_op_thread_count"].string_value == "2"
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    ensemble = ModelConfig(name="search", path=Path("."), backend="ensemble", pipeline="search",
                           max_batch_size=1, inputs=EMBED.inputs, outputs=EMBED.outputs,
                           ensemble=SearchSteps(embed="embed"))
    document = kserve.triton_config(ensemble, threads=0)
    steps = codec.model_config(document).config.ensemble_scheduling.step
    assert [(s.model_name, s.model_version) for s in steps] == [("embed", -1)]


def test_repository_index_keeps_each_model_s_state_and_reason() -> None:
    entries = [{"name": "a", "version": "1", "state": "READY"},
               {"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "broken"}]
    index = codec.repository_index(entries).models
    assert [(m.name, m.state) for m in index] == [("a", "READY"), ("b", "UNAVAILABLE")]
    assert index[1].reason == "broken"


# -- the service: the API key and the one error mapping -------------------------------------


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self, *metadata: tuple[str, str]) -> None:
        self.metadata = metadata
        self.aborted: tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str,
                    trailing_metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.aborted = (code, details, trailing_metadata)
        raise Aborted


def service(tmp_path: Path, *keys: str) -> InferenceService:
    return InferenceService(ServerState(ModelRepository(tmp_path), auth=AccessControl(keys)))


async def test_an_error_is_its_own_status_with_its_headers(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    served = service(tmp_path)

    def busy() -> None:
        raise Unavailable("model 'x' is busy", retry_after_s=2)

    monkeypatch.setattr(served.state.repository, "index", busy)
    context = FakeContext(("x-request-id", "call-1"))
    with pytest.raises(Aborted):
        await served.RepositoryIndex(pb.RepositoryIndexRequest(), context)
    assert context.aborted == (grpc.StatusCode.UNAVAILABLE, "model 'x' is busy",
                               (("retry-after", "2"), ("x-request-id", "call-1")))


async def test_a_bug_is_internal_and_leaks_nothing(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    served = service(tmp_path)

    def broken() -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(served.state.repository, "index", broken)
    context = FakeContext(("x-request-id", "call-2"))
    with caplog.at_level(logging.ERROR), pytest.raises(Aborted):
        await served.RepositoryIndex(pb.RepositoryIndexRequest(), context)
    assert context.aborted == (grpc.StatusCode.INTERNAL, "internal server error",
                               (("x-request-id", "call-2"),))
    assert "secret detail" in caplog.text and "RepositoryIndex" in caplog.text


async def test_keys_guard_all_but_health_and_refusals_are_counted(tmp_path: Path) -> None:
    served = service(tmp_path, "k1")
    live = await served.ServerLive(pb.ServerLiveRequest(), FakeContext())
    assert live.live
    for metadata in ((), (("authorization", "Bearer nope"),)):
        context = FakeContext(*metadata)
        with pytest.raises(Aborted):
            await served.ServerMetadata(pb.ServerMetadataRequest(), context)
        assert context.aborted is not None
        assert context.aborted[0] == grpc.StatusCode.UNAUTHENTICATED
    assert served.state.auth.failures == 2
    answer = await served.ServerMetadata(pb.ServerMetadataRequest(),
                                         FakeContext(("authorization", "Bearer k1")))
    assert "classification" in answer.extensions
