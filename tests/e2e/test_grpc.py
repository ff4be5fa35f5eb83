"""KServe v2 over gRPC, end to end: a real server on 127.0.0.1 serving HTTP and gRPC side by
side, real clients (tritonclient.grpc, Triton's own stub, tritonclient.http, perf_analyzer -i
grpc), the real `embed` and `intent` models beside fake ones."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import (
    REPOSITORY,
    RunningServer,
    free_port,
    start_server,
    stop_server,
    write_fake_model,
)

QUERIES = ["wake me up at five am this week", "play some jazz", "olly what's the weather"]
MAX_ITEMS = 16
MAX_MESSAGE_BYTES = 64 * 1024
KEY = "grpc-test-key-0123456789"


@dataclass
class Served:
    http: RunningServer
    grpc_address: str

    def client(self) -> triton_grpc.InferenceServerClient:
        return triton_grpc.InferenceServerClient(self.grpc_address)

    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        return service_pb2_grpc.GRPCInferenceServiceStub(
            grpc.insecure_channel(self.grpc_address))


def serve(repository: Path, *extra: str) -> Served:
    address = f"127.0.0.1:{free_port()}"
    return Served(start_server(repository, repository / "server.log", "--grpc", address,
                               *extra), address)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The prepared `embed` and `intent` models and two fake ones, with small limits."""
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default models are not prepared: run `make prepare` (make test does)")
    repository = tmp_path_factory.mktemp("grpc")
    for name in ("embed", "intent"):
        (repository / name).symlink_to(REPOSITORY / name)
    write_fake_model(repository, "fake")
    write_fake_model(repository, "reloadable")
    server = serve(repository, "--max-items", str(MAX_ITEMS),
                   "--max-body-bytes", str(MAX_MESSAGE_BYTES))
    yield server
    stop_server(server.http)


def text_input(texts: list[str], module: object = triton_grpc) -> object:
    tensor = module.InferInput("text", [len(texts), 1], "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    return tensor


def typed_request(model: str, texts: list[str], **extra: object) -> service_pb2.ModelInferRequest:
    """A request whose texts travel in `contents.bytes_contents`, not raw."""
    request = service_pb2.ModelInferRequest(model_name=model, **extra)  # type: ignore[arg-type]
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts), 1])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    return request


def code_of(call: object, *args: object, **kwargs: object) -> tuple[grpc.StatusCode, str]:
    """The status and message a call fails with, from the stub or from tritonclient.grpc
    (which wraps the status as "StatusCode.NAME")."""
    with pytest.raises((grpc.RpcError, InferenceServerException)) as error:
        call(*args, **kwargs)  # type: ignore[operator]
    if isinstance(error.value, InferenceServerException):
        return grpc.StatusCode[error.value.status().split(".")[-1]], error.value.message()
    return error.value.code(), error.value.details()  # type: ignore[attr-defined]


def test_health_metadata_config_and_statistics(served: Served) -> None:
    client = served.client()
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("embed") and client.is_model_ready("fake")
    assert not client.is_model_ready("fake", "7")
    assert "classification" in client.get_server_metadata().extensions
    http = triton_http.InferenceServerClient(served.http.host_port)
    metadata = client.get_model_metadata("embed", as_json=True)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert metadata["outputs"][0]["shape"] == ["-1", "384"]
    config = client.get_model_config("embed").config
    expected = http.get_model_config("embed")
    assert config.max_batch_size == expected["max_batch_size"] == 64
    assert [(i.name, i.dims) for i in config.input] == [("text", [1])]
    assert config.input[0].data_type == model_config_pb2.TYPE_STRING
    assert config.dynamic_batching.default_queue_policy.max_queue_size == \
        expected["dynamic_batching"]["default_queue_policy"]["max_queue_size"]
    assert config.instance_group[0].kind == config.instance_group[0].KIND_CPU
    client.infer("embed", [text_input(["count me"])])
    stats = client.get_inference_statistics("embed").model_stats[0]
    assert stats.inference_stats.success.count >= 1 and stats.inference_stats.compute_infer.ns
    everyone = client.get_inference_statistics().model_stats
    assert {s.name for s in everyone} == {"embed", "intent", "fake", "reloadable"}


def test_repository_index_load_and_unload(served: Served) -> None:
    client = served.client()
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index == dict.fromkeys(["embed", "fake", "intent", "reloadable"], "READY")
    client.unload_model("reloadable")
    assert not client.is_model_ready("reloadable")
    code, message = code_of(client.infer, "reloadable", [text_input(["a"])])
    assert code == grpc.StatusCode.UNAVAILABLE and "is not loaded" in message
    client.load_model("reloadable")
    assert client.is_model_ready("reloadable")
    with pytest.raises(InferenceServerException, match="not in the repository"):
        client.load_model("nope")
    with pytest.raises(InferenceServerException, match="load parameters"):
        client.load_model("reloadable", config='{"max_batch_size": 2}')


def test_the_repository_routes_mean_the_same_over_http(served: Served) -> None:
    """HTTP took no body on these routes: a config override (tritonclient's `load_model(config=
    ...)`) was answered 200 and not applied, and `{"ready": true}` listed every model."""
    http = triton_http.InferenceServerClient(served.http.host_port)
    client = served.client()
    http.unload_model("reloadable", unload_dependents=False)
    try:
        listed = {m["name"] for m in http.get_model_repository_index()}
        ready = httpx.post(f"{served.http.url}/v2/repository/index", json={"ready": True})
        assert "reloadable" in listed and ready.status_code == 200
        assert {m["name"] for m in ready.json()} == listed - {"reloadable"}
        ready_grpc = served.stub().RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
        assert {m.name for m in ready_grpc.models} == listed - {"reloadable"}
        with pytest.raises(InferenceServerException, match="load parameters"):
            http.load_model("reloadable", config='{"max_batch_size": 2}')
        with pytest.raises(InferenceServerException, match="unload parameters"):
            http.unload_model("embed", unload_dependents=True)
        for path, body in (("/v2/repository/models/reloadable/load", b"{"),
                           ("/v2/repository/index", b'{"ready": "yes"}'),
                           ("/v2/repository/models/reloadable/load", b'{"parameters": 3}'),
                           # misspelt, so the override in it was ignored: 200
                           ("/v2/repository/models/reloadable/load",
                            b'{"paramters": {"config": "{}"}}')):
            refused = httpx.post(f"{served.http.url}{path}", content=body)
            assert refused.status_code == 400, (path, body, refused.text)
        assert not http.is_model_ready("reloadable")  # nothing refused was done
    finally:
        http.load_model("reloadable")
    assert http.is_model_ready("reloadable") and client.is_model_ready("reloadable")


@pytest.mark.parametrize("model", ["fake", "embed"])
def test_grpc_answers_the_vectors_http_does(served: Served, model: str) -> None:
    http = triton_http.InferenceServerClient(served.http.host_port)
    over_http = http.infer(model, [text_input(QUERIES, triton_http)]).as_numpy(
        "embedding")
    raw = served.client().infer(model, [text_input(QUERIES)])
    assert raw.get_response().raw_output_contents  # raw in, raw out, as Triton answers
    # atol: dynamic int8 makes a vector depend on its batch-mates, the same here both times
    np.testing.assert_allclose(raw.as_numpy("embedding"), over_http, rtol=0, atol=1e-6)
    typed = served.stub().ModelInfer(typed_request(model, QUERIES))
    assert not typed.raw_output_contents and list(typed.outputs[0].shape) == list(over_http.shape)
    vectors = np.array(typed.outputs[0].contents.fp32_contents, dtype=np.float32)
    np.testing.assert_allclose(vectors.reshape(over_http.shape), over_http, rtol=0, atol=1e-6)


def test_request_id_and_parameters_reach_the_answer(served: Served) -> None:
    request = typed_request("fake", ["a"], id="req-7")
    request.parameters["timeout"].int64_param = 5_000_000
    assert served.stub().ModelInfer(request).id == "req-7"
    request.parameters["timeout"].int64_param = -1
    code, message = code_of(served.stub().ModelInfer, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "parameter 'timeout' is -1" in message


def test_a_request_id_in_metadata_comes_back_in_the_trailers(served: Served) -> None:
    metadata = (("x-request-id", "trace-9"),)
    _, call = served.stub().ModelInfer.with_call(typed_request("fake", ["a"]),
                                                 metadata=metadata)
    assert ("x-request-id", "trace-9") in tuple(call.trailing_metadata())
    with pytest.raises(grpc.RpcError) as failed:
        served.stub().ModelInfer(typed_request("nope", ["a"]), metadata=metadata)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    assert ("x-request-id", "trace-9") in tuple(failed.value.trailing_metadata())


def top_classes(answer: np.ndarray) -> list[list[str]]:
    return [[v.decode() if isinstance(v, bytes) else str(v) for v in row] for row in answer]


def test_classification_extension_over_grpc_and_http(served: Served) -> None:
    texts = QUERIES[:2]
    grpc_client, http = served.client(), triton_http.InferenceServerClient(served.http.host_port)
    scores = grpc_client.infer("intent", [text_input(texts)]).as_numpy("probabilities")
    over_grpc = top_classes(grpc_client.infer(
        "intent", [text_input(texts)],
        outputs=[triton_grpc.InferRequestedOutput("probabilities", class_count=3)],
    ).as_numpy("probabilities"))
    for binary in (False, True):
        over_http = top_classes(http.infer(
            "intent", [text_input(texts, triton_http)],
            outputs=[triton_http.InferRequestedOutput("probabilities", binary_data=binary,
                                                      class_count=3)],
        ).as_numpy("probabilities"))
        assert over_http == over_grpc
    typed = served.stub().ModelInfer(typed_request(
        "intent", texts, outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(
            name="probabilities",
            parameters={"classification": service_pb2.InferParameter(int64_param=3)})]))
    assert [v.decode() for v in typed.outputs[0].contents.bytes_contents] == \
        [v for row in over_grpc for v in row]
    assert typed.outputs[0].datatype == "BYTES" and list(typed.outputs[0].shape) == [2, 3]
    for row, classes in zip(scores, over_grpc, strict=True):
        score, index, label = classes[0].split(":")
        assert int(index) == int(np.argmax(row)) and float(score) == pytest.approx(row.max(),
                                                                                   abs=1e-6)
        assert label and label != f"label_{index}"  # the model's own label names
        assert [int(c.split(":")[1]) for c in classes] == list(np.argsort(-row, kind="stable")[:3])


@pytest.mark.parametrize(("model", "count", "message"), [
    ("intent", 0, "parameter 'classification' is 0"),
    ("embed", 2, "the classification extension serves text_classification models only"),
])
def test_bad_classification_requests_are_invalid_over_both(served: Served, model: str,
                                                          count: int, message: str) -> None:
    output = "probabilities" if model == "intent" else "embedding"
    code, details = code_of(served.stub().ModelInfer, typed_request(
        model, ["a"], outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(
            name=output, parameters={"classification": service_pb2.InferParameter(
                int64_param=count)})]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    answer = httpx.post(f"{served.http.url}/v2/models/{model}/infer", json={
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}],
        "outputs": [{"name": output, "parameters": {"classification": count}}]})
    assert answer.status_code == 400 and message in answer.json()["error"]


def raw_request(model: str, texts: list[bytes], **extra: object) -> service_pb2.ModelInferRequest:
    blob = b"".join(len(t).to_bytes(4, "little") + t for t in texts)
    request = service_pb2.ModelInferRequest(model_name=model, raw_input_contents=[blob],
                                            **extra)  # type: ignore[arg-type]
    request.inputs.add(name="text", datatype="BYTES", shape=[len(texts), 1])
    return request


def with_input(request: service_pb2.ModelInferRequest, **fields: object,
               ) -> service_pb2.ModelInferRequest:
    for name, value in fields.items():
        tensor = request.inputs[0]
        if name == "shape":
            del tensor.shape[:]
            tensor.shape.extend(value)  # type: ignore[call-overload]
        else:
            setattr(tensor, name, value)
    return request


BAD_REQUESTS = [
    ("unknown model", lambda: raw_request("nope", [b"a"]), grpc.StatusCode.NOT_FOUND,
     "unknown model 'nope'; this server has:"),
    ("unknown version", lambda: raw_request("fake", [b"a"], model_version="7"),
     grpc.StatusCode.NOT_FOUND, "has no version '7'"),
    ("unknown input", lambda: with_input(raw_request("fake", [b"a"]), name="query"),
     grpc.StatusCode.INVALID_ARGUMENT, "has no input 'query'"),
    ("wrong datatype", lambda: with_input(raw_request("fake", [b"a"]), datatype="INT64"),
     grpc.StatusCode.INVALID_ARGUMENT, "has datatype 'INT64'; expected BYTES"),
    ("wrong shape", lambda: with_input(raw_request("fake", [b"a"]), shape=[1, 2]),
     grpc.StatusCode.INVALID_ARGUMENT, "has shape [1, 2]; expected [batch, 1]"),
    ("shape and raw data disagree", lambda: with_input(raw_request("fake", [b"a"]), shape=[2, 1]),
     grpc.StatusCode.INVALID_ARGUMENT, "binary BYTES data ends before element 1"),
    ("typed data and shape disagree", lambda: with_input(typed_request("fake", ["a"]),
                                                         shape=[3, 1]),
     grpc.StatusCode.INVALID_ARGUMENT, "has 1 elements of data in bytes_contents; its shape"),
    ("raw entries and inputs disagree",
     lambda: service_pb2.ModelInferRequest(model_name="fake", raw_input_contents=[b"", b""],
                                           inputs=[{"name": "text", "datatype": "BYTES",
                                                    "shape": [1]}]),
     grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 2 entries for 1 inputs"),
    ("empty text", lambda: raw_request("fake", [b"ok", b"  "]), grpc.StatusCode.INVALID_ARGUMENT,
     "input 'text'[1] is empty"),
    ("non-UTF-8 text", lambda: raw_request("fake", [b"ok", b"\xff\xfe"]),
     grpc.StatusCode.INVALID_ARGUMENT, "input 'text'[1] is not valid UTF-8"),
    ("too many items", lambda: raw_request("fake", [b"q"] * (MAX_ITEMS + 1)),
     grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_ITEMS} are allowed"),
    ("message over the size limit", lambda: raw_request("fake", [b"q" * MAX_MESSAGE_BYTES]),
     grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
]


@pytest.mark.parametrize(("case", "request_of", "code", "message"), BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_requests_get_a_status_that_names_the_problem(
        served: Served, case: str, request_of: object, code: grpc.StatusCode,
        message: str) -> None:
    got, details = code_of(served.stub().ModelInfer, request_of())  # type: ignore[operator]
    assert got == code and message in details, details
    assert "Traceback" not in details


def test_a_stream_answers_each_request_and_goes_on_past_a_failed_one(served: Served) -> None:
    """tritonclient's stream: each request answered with its id, a failed one with its error
    in the stream (Triton's `error_message`), and the stream goes on; the numbers are the
    unary call's. (It was UNIMPLEMENTED, and tritonclient.grpc.aio sometimes saw INTERNAL.)"""
    client = served.client()
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, text in enumerate(QUERIES):
            client.async_stream_infer("embed", [text_input([text])], request_id=f"q{i}")
        client.async_stream_infer("nope", [text_input(["x"])], request_id="bad")
        client.async_stream_infer("fake", [text_input(["a", "b"])], request_id="pair")
        got = [answers.get(timeout=30) for _ in range(len(QUERIES) + 2)]
        client.async_stream_infer("fake", [text_input(["after"])], request_id="after")
        got.append(answers.get(timeout=30))  # the stream went on past the failure
    finally:
        client.stop_stream()
    errors = [error for _, error in got if error is not None]
    assert len(errors) == 1 and "unknown model 'nope'" in str(errors[0]), errors
    results = {r.get_response().id: r for r, _ in got if r is not None}  # type: ignore[attr-defined]
    assert sorted(results) == ["after", "pair", "q0", "q1", "q2"]
    assert results["pair"].as_numpy("embedding").shape == (2, 16)  # type: ignore[attr-defined]
    for i, text in enumerate(QUERIES):
        unary = client.infer("embed", [text_input([text])]).as_numpy("embedding")
        streamed = results[f"q{i}"].as_numpy("embedding")  # type: ignore[attr-defined]
        # int8 activations are scaled per batch: the stream's batches differ from the unary's
        cosine = float((unary * streamed).sum() / np.linalg.norm(unary) / np.linalg.norm(streamed))
        assert cosine > 0.999, (text, cosine)


def test_unknown_models_are_not_found_and_named_repositories_refused(served: Served) -> None:
    stub = served.stub()
    for call, request in (  # Triton refuses repository_name; it was ignored (a reload done)
            (stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(repository_name="other")),
            (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(
                repository_name="other", model_name="reloadable")),
            (stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(
                repository_name="other", model_name="reloadable"))):
        code, details = code_of(call, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "repository_name" in details
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="reloadable")).ready
    for call, request in ((stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="nope")),
                          (stub.ModelConfig, service_pb2.ModelConfigRequest(name="nope"))):
        code, details = code_of(call, request)
        assert code == grpc.StatusCode.NOT_FOUND and "unknown model 'nope'" in details
    # Readiness is asked, not the model: Triton answers "not ready" for a model it lacks.
    assert not stub.ModelReady(service_pb2.ModelReadyRequest(name="nope")).ready


def test_a_stream_left_open_ends_when_the_server_drains(tmp_path: Path) -> None:
    """A client holding a stream open with nothing more to send: on SIGTERM the stream ends
    once its requests are answered, rather than hold the drain for the whole grace period."""
    write_fake_model(tmp_path, "fake", delay_ms=200)
    server = serve(tmp_path)
    hold = threading.Event()

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        yield raw_request("fake", [b"a"], id="one")
        hold.wait(60)  # open, silent

    try:
        call = server.stub().ModelStreamInfer(requests())
        time.sleep(0.1)  # the request is being answered
        signalled = time.monotonic()
        server.http.process.send_signal(signal.SIGTERM)
        answers = list(call)  # ends, with the one answer
        ended_s = time.monotonic() - signalled
        assert [a.infer_response.id for a in answers] == ["one"]
        assert not answers[0].error_message and call.code() == grpc.StatusCode.OK
        assert server.http.process.wait(timeout=15) == 0
        assert ended_s < 5, ended_s  # the drain timeout is 30 s
    finally:
        hold.set()
        if server.http.process.poll() is None:
            stop_server(server.http)


def perf_analyzer_env() -> dict[str, str]:
    import nvidia.cuda_runtime  # the wheel whose lib/ holds the libcudart perf_analyzer loads

    lib = Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib"
    return {**os.environ, "LD_LIBRARY_PATH": str(lib)}


def test_perf_analyzer_over_grpc_reads_config_and_server_statistics(served: Served) -> None:
    binary = Path(sys.executable).parent / "perf_analyzer"
    if not binary.is_file():
        pytest.fail("perf_analyzer is missing: it comes with tritonclient[http]==2.51.0")
    result = subprocess.run(
        [str(binary), "-m", "embed", "-u", served.grpc_address, "-i", "grpc",
         "--string-data", "how to find cheap flights to paris", "-b", "1",
         "--concurrency-range", "4", "--measurement-mode", "count_windows",
         "--measurement-request-count", "200", "--max-trials", "3",
         "--stability-percentage", "999", "--percentile", "99", "-v"],
        capture_output=True, text=True, timeout=120, env=perf_analyzer_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout and "Avg gRPC time" in result.stdout
    # the server-side breakdown comes from our ModelStatistics answer
    assert "Server:" in result.stdout and "compute infer" in result.stdout
    streaming = subprocess.run(
        [str(binary), "-m", "embed", "-u", served.grpc_address, "-i", "grpc", "--streaming",
         "--string-data", "how to find cheap flights to paris", "-b", "1",
         "--concurrency-range", "4", "--measurement-mode", "count_windows",
         "--measurement-request-count", "100", "--max-trials", "3",
         "--stability-percentage", "999"],
        capture_output=True, text=True, timeout=120, env=perf_analyzer_env())
    assert streaming.returncode == 0, streaming.stdout + streaming.stderr
    assert "Throughput:" in streaming.stdout


def test_queryserve_bench_over_grpc_reports_client_and_server_figures(served: Served,
                                                                      tmp_path: Path) -> None:
    url = f"grpc://{served.grpc_address}"
    done = subprocess.run(
        [sys.executable, "-m", "queryserve", "bench", url, "--protocol", "grpc", "--model",
         "fake", "--rate", "100", "--duration", "1", "--warmup", "0.2", "--out",
         str(tmp_path / "ok"), "--no-progress"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    step = json.loads((tmp_path / "ok" / "results.json").read_text())["steps"][0]
    assert step["by_status"] == {"200": 100} and step["errors"] == step["timeouts"] == 0
    assert step["server"]["requests"] >= 100  # ModelStatistics, read over gRPC
    failed = subprocess.run(
        [sys.executable, "-m", "queryserve", "bench", url, "--protocol", "grpc", "--model",
         "nope", "--rate", "50", "--duration", "0.5", "--warmup", "0", "--out",
         str(tmp_path / "nope"), "--no-progress"], capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "refused the first request with 404" in failed.stderr
    assert "NOT_FOUND" in failed.stderr and not (tmp_path / "nope").exists()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with an API key and a slow model (300 ms a batch)."""
    repository = tmp_path_factory.mktemp("grpc-guarded")
    write_fake_model(repository, "slow", delay_ms=300)
    server = serve(repository, "--api-key", KEY)
    yield server
    if server.http.process.poll() is None:
        stop_server(server.http)


def test_api_key_guards_every_rpc_but_health(guarded: Served) -> None:
    client = guarded.client()
    assert client.is_server_live() and client.is_server_ready()
    code, details = code_of(guarded.stub().ModelInfer, raw_request("slow", [b"a"]))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization: Bearer KEY" in details
    code, details = code_of(guarded.stub().RepositoryIndex, service_pb2.RepositoryIndexRequest(),
                            metadata=[("authorization", "Bearer wrong")])
    assert code == grpc.StatusCode.UNAUTHENTICATED and details == "the API key is not valid"
    headers = {"authorization": f"Bearer {KEY}"}
    assert client.is_model_ready("slow", headers=headers)
    answer = client.infer("slow", [text_input(["a"])], headers=headers)
    assert answer.as_numpy("embedding").shape == (1, 16)
    code, details = code_of(lambda: list(guarded.stub().ModelStreamInfer(iter([
        raw_request("slow", [b"a"])]))))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization: Bearer KEY" in details
    streamed = list(guarded.stub().ModelStreamInfer(iter([raw_request("slow", [b"a"])]),
                                                    metadata=[("authorization", f"Bearer {KEY}")]))
    assert len(streamed) == 1 and not streamed[0].error_message
    # Two keys, a wrong one first: refused as over HTTP (the last was taken: it passed).
    twice = [("authorization", "Bearer wrong"), ("authorization", f"Bearer {KEY}")]
    code, details = code_of(guarded.stub().RepositoryIndex, service_pb2.RepositoryIndexRequest(),
                            metadata=twice)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "more than one authorization" in details
    code, _ = code_of(lambda: list(guarded.stub().ModelStreamInfer(iter([
        raw_request("slow", [b"a"])]), metadata=twice)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_message_that_does_not_parse_is_invalid_and_logs_nothing(guarded: Served) -> None:
    """Regression: grpc.aio answered UNKNOWN naming protobuf's DecodeError, and logged a
    7-line traceback per call, for clients with no key too (71 KB of log for 100 calls)."""
    channel = grpc.insecure_channel(guarded.grpc_address)
    logged = guarded.http.log.stat().st_size
    for method in ("ModelInfer", "ServerLive", "RepositoryIndex"):
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        code, details = code_of(call, b"\xff\xff\xff", timeout=10,
                                metadata=[("authorization", f"Bearer {KEY}")])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code, details)
        assert details.startswith("the request message does not parse")
    # Without the key, the key is what is refused.
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    assert code_of(call, b"\xff\xff\xff", timeout=10)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert guarded.http.log.stat().st_size == logged
    channel.close()


def test_sigterm_lets_an_rpc_in_flight_finish(guarded: Served) -> None:
    client = guarded.client()
    headers = {"authorization": f"Bearer {KEY}"}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client.infer, "slow", [text_input(["still answered"])],
                             headers=headers)
        time.sleep(0.1)  # the RPC is in the model's queue or batch
        guarded.http.process.send_signal(signal.SIGTERM)
        assert answer.result(timeout=10).as_numpy("embedding").shape == (1, 16)
    assert guarded.http.process.wait(timeout=15) == 0


def test_a_taken_grpc_port_is_an_error_that_names_it(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "fake")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
             "--http", f"127.0.0.1:{free_port()}", "--grpc", address],
            capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"cannot listen for gRPC on {address}" in done.stderr


def test_grpc_calls_are_in_the_access_log_with_a_request_id(tmp_path: Path) -> None:
    """Regression (the observability walk): gRPC calls left no access-log line, and a call
    without `x-request-id` got none back (HTTP always answers with one)."""
    write_fake_model(tmp_path, "fast")
    log_file = tmp_path / "access.jsonl"
    served = serve(tmp_path, "--access-log", str(log_file))
    try:
        stub = served.stub()
        _, call = stub.ModelInfer.with_call(raw_request("fast", [b"a"]))
        made = dict(call.trailing_metadata())["x-request-id"]
        assert made
        code, _ = code_of(stub.ModelInfer, raw_request("nothing", [b"a"]),
                          metadata=[("x-request-id", "grpc-404")])
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        stop_server(served.http)
    lines = {line["id"]: line for line in map(orjson.loads, log_file.read_bytes().splitlines())}
    ok = lines[made]
    assert (ok["method"], ok["path"], ok["model"], ok["status"]) == (
        "POST", "/inference.GRPCInferenceService/ModelInfer", "fast", 200)
    assert ok["bytes_in"] > 0 and ok["bytes_out"] > 0
    assert (lines["grpc-404"]["status"], lines["grpc-404"]["model"]) == (404, "nothing")


def test_the_grpc_port_holds_http_s_connection_limits(tmp_path: Path) -> None:
    """Regression (the wire walk): the gRPC port had no cap, no time to open and no idle time,
    so silent sockets piled up there until the process ran out of files."""
    write_fake_model(tmp_path, "fast")
    served = serve(tmp_path, "--max-connections", "4", "--header-timeout", "1",
                   "--idle-timeout", "2")
    host, port = served.grpc_address.rsplit(":", 1)
    silent: list[socket.socket] = []

    def closed(sock: socket.socket) -> bool:
        sock.settimeout(0.05)
        try:
            while sock.recv(1024):  # the server's SETTINGS frame, then the close
                pass
        except TimeoutError:
            return False
        return True

    try:
        silent += [socket.create_connection((host, int(port))) for _ in range(6)]
        time.sleep(0.5)
        assert sum(map(closed, silent)) == 2  # over the cap of 4: closed at once
        time.sleep(1.5)
        assert all(map(closed, silent))  # the others, HTTP/2's opening not sent within 1 s
        client = served.client()
        assert client.is_model_ready("fast")
        time.sleep(3)  # idle past 2 s: the server ends the connection, the client reconnects
        assert client.is_model_ready("fast")
        client.close()
    finally:
        for sock in silent:
            sock.close()
        stop_server(served.http)
