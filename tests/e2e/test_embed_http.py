"""The default `embed` model over HTTP, end to end: real server, real ONNX model, real clients
(tritonclient, httpx, perf_analyzer)."""

from __future__ import annotations

import base64
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer, minilm_dir

QUERIES = ["wake me up at five am this week", "play some jazz", "olly what's the weather"]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    return model.encode(QUERIES, normalize_embeddings=True)  # type: ignore[no-any-return]


def text_input(texts: list[str], binary: bool) -> triton_http.InferInput:
    tensor = triton_http.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object),
                               binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_gets_sentence_transformers_embeddings(
        real_server: RunningServer, reference: np.ndarray, binary: bool) -> None:
    client = triton_http.InferenceServerClient(real_server.host_port)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("embed")
    result = client.infer("embed", [text_input(QUERIES, binary)],
                          outputs=[triton_http.InferRequestedOutput("embedding",
                                                                    binary_data=binary)])
    vectors = result.as_numpy("embedding")
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    cosines = np.sum(vectors * reference, axis=1)
    assert cosines.min() >= 0.99  # the served variant passed the same gate at prepare time


def test_metadata_config_and_stats_as_triton_clients_read_them(real_server: RunningServer) -> None:
    client = triton_http.InferenceServerClient(real_server.host_port)
    metadata = client.get_model_metadata("embed")
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    config = client.get_model_config("embed")
    assert config["max_batch_size"] == 64
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    assert "statistics" in client.get_server_metadata()["extensions"]
    client.infer("embed", [text_input(["count me"], True)])
    stats = client.get_inference_statistics("embed")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")


def test_openai_embeddings_float_and_base64(real_server: RunningServer,
                                           reference: np.ndarray) -> None:
    with httpx.Client(base_url=real_server.url) as client:
        floats = client.post("/v1/embeddings", json={"model": "embed", "input": QUERIES}).json()
        alone = client.post("/v1/embeddings", json={"model": "embed", "input": QUERIES[0]}).json()
        packed = client.post("/v1/embeddings", json={"model": "embed", "input": QUERIES[0],
                                                     "encoding_format": "base64"}).json()
    assert floats["object"] == "list" and floats["model"] == "embed"
    vectors = np.array([d["embedding"] for d in floats["data"]], dtype=np.float32)
    assert [d["index"] for d in floats["data"]] == [0, 1, 2]
    assert np.sum(vectors * reference, axis=1).min() >= 0.99
    assert floats["usage"]["prompt_tokens"] > len(QUERIES) * 3
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype=np.float32)
    # the same query alone both times: dynamic int8 makes a vector depend on its batch-mates
    np.testing.assert_allclose(decoded, alone["data"][0]["embedding"], atol=1e-6)


def binary_body(texts: list[bytes], declared: int | None = None) -> tuple[bytes, dict[str, str]]:
    blob = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    header = (b'{"inputs":[{"name":"text","shape":[%d,1],"datatype":"BYTES",'
              b'"parameters":{"binary_data_size":%d}}]}' % (len(texts), len(blob)))
    length = len(header) if declared is None else declared
    return header + blob, {"inference-header-content-length": str(length)}


def json_infer(data: object, shape: object = None, datatype: str = "BYTES",
               name: str = "text") -> dict[str, object]:
    count = len(data) if isinstance(data, list) else 1
    return {"inputs": [{"name": name, "shape": shape if shape is not None else [count, 1],
                        "datatype": datatype, "data": data}]}


BAD_REQUESTS = [
    ("malformed JSON", {"content": b'{"inputs": ['}, 400, "not valid JSON"),
    ("no inputs", {"json": {"outputs": []}}, 400, "'inputs' must be a non-empty list"),
    ("unknown input", {"json": json_infer(["a"], name="query")}, 400, "has no input 'query'"),
    ("wrong datatype", {"json": json_infer([1, 2], datatype="INT64")}, 400,
     "has datatype 'INT64'; expected BYTES"),
    ("wrong shape", {"json": json_infer(["a", "b"], shape=[1, 2])}, 400,
     "has shape [1, 2]; expected [batch, 1]"),
    ("shape and data disagree", {"json": json_infer(["a", "b"], shape=[3, 1])}, 400,
     "has 2 elements of data; its shape says 3"),
    ("empty text", {"json": json_infer(["ok", "  "])}, 400, "input 'text'[1] is empty"),
    ("no visible text", {"json": json_infer(["ok", "\u0000\u200b\ufeff"])}, 400,
     "input 'text'[1] is empty"),
    ("not a string", {"json": json_infer(["ok", 5])}, 400, "input 'text'[1] must be a string"),
    ("non-UTF-8 text", dict(zip(("content", "headers"), binary_body([b"ok", b"\xff\xfe"]),
                                strict=True)), 400, "input 'text'[1] is not valid UTF-8"),
    ("binary header past the body", dict(zip(("content", "headers"),
                                             binary_body([b"ok"], declared=10_000),
                                             strict=True)), 400,
     "inference-header-content-length is '10000'"),
    ("too many items", {"json": json_infer(["q"] * 1025)}, 413, "at most 1024 are allowed"),
    # Each of these was answered 200, the part in question ignored or misread.
    ("binary_data as a string", {"json": {**json_infer(["a"]), "outputs": [
        {"name": "embedding", "parameters": {"binary_data": "false"}}]}}, 400,
     "'binary_data' must be true or false, got \"false\""),
    ("binary_data_output as a string", {"json": {**json_infer(["a"]), "parameters": {
        "binary_data_output": "false"}}}, 400, "'binary_data_output' must be true or false"),
    # The value quoted in JSON, as the client wrote it (it said None, True: Python's words).
    ("timeout true", {"json": {**json_infer(["a"]), "parameters": {"timeout": True}}}, 400,
     "parameter 'timeout' is true; expected microseconds"),
    ("binary_data null", {"json": {**json_infer(["a"]), "outputs": [
        {"name": "embedding", "parameters": {"binary_data": None}}]}}, 400,
     "'binary_data' must be true or false, got null"),
    ("an output asked for twice", {"json": {**json_infer(["a"]), "outputs": [
        {"name": "embedding"}, {"name": "embedding"}]}}, 400,
     "output 'embedding' is asked for twice"),
    ("an output in shared memory", {"json": {**json_infer(["a"]), "outputs": [
        {"name": "embedding", "parameters": {"shared_memory_region": "out0",
                                             "shared_memory_byte_size": 1536}}]}}, 400,
     "outputs[0]: shared memory is not supported"),
    ("an id that is not a string", {"json": {**json_infer(["a"]), "id": {"a": 1}}}, 400,
     "'id' must be a string"),
    ("data and binary data both", dict(zip(("content", "headers"), (
        b'{"inputs":[{"name":"text","shape":[1,1],"datatype":"BYTES","data":["x"],'
        b'"parameters":{"binary_data_size":9}}]}\x05\x00\x00\x00hello',
        {"inference-header-content-length": "110"}), strict=True)), 400,
     "inputs[0] has both data and binary_data_size"),
    ("body over the size limit", {"content": b"x" * (8 * 1024 * 1024 + 1)}, 413,
     "over the limit of 8388608 bytes"),
]


@pytest.mark.parametrize(("case", "request_kwargs", "status", "message"), BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_input_gets_a_4xx_that_names_the_problem(
        real_server: RunningServer, case: str, request_kwargs: dict[str, object], status: int,
        message: str) -> None:
    response = httpx.post(f"{real_server.url}/v2/models/embed/infer", timeout=30,
                          **request_kwargs)  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert "Traceback" not in response.text


@pytest.mark.parametrize(("method", "path", "body", "status", "message"), [
    ("POST", "/v2/models/nope/infer", {}, 404,
     "unknown model 'nope'; this server has: duplicates, duplicates-bi, embed"),
    ("GET", "/v2/models/embed/infer", None, 405, "use POST"),
    ("GET", "/v2/models/embed/versions/7", None, 404, "has no version '7'"),
    ("GET", "/nowhere", None, 404, "no route GET /nowhere"),
])
def test_wrong_routes_and_models(real_server: RunningServer, method: str, path: str,
                                 body: object, status: int, message: str) -> None:
    response = httpx.request(method, real_server.url + path, json=body)
    assert response.status_code == status and message in response.json()["error"]


def test_metrics_report_requests_batches_and_latency(real_server: RunningServer) -> None:
    httpx.post(f"{real_server.url}/v2/models/embed/infer", json=json_infer(["metrics please"]))
    text = httpx.get(f"{real_server.url}/metrics").text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values['queryserve_requests_total{model="embed",outcome="success"}'] >= 1
    assert values['queryserve_batch_size_count{model="embed"}'] >= 1
    assert values['queryserve_queue_duration_seconds_count{model="embed"}'] >= 1
    # Labels in the library's order (sorted by name).
    assert values['queryserve_request_duration_seconds_bucket{le="+Inf",model="embed"}'] >= 1
    assert values['queryserve_queue_depth{model="embed"}'] == 0
    assert values['queryserve_model_ready{model="embed"}'] == 1
    assert values["queryserve_http_connections"] >= 1  # this client's, at least
    assert values["queryserve_http_connections_refused_total"] == 0
    assert values["queryserve_http_connections_evicted_total"] == 0


def perf_analyzer() -> Path:
    binary = Path(sys.executable).parent / "perf_analyzer"
    if not binary.is_file():
        pytest.fail("perf_analyzer is missing: it comes with tritonclient[http]==2.51.0")
    return binary


def test_perf_analyzer_runs_against_embed_unchanged(real_server: RunningServer) -> None:
    import nvidia.cuda_runtime  # the wheel whose lib/ holds the libcudart perf_analyzer loads

    cuda_lib = Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": str(cuda_lib)}
    if shutil.which("dpkg") and subprocess.run(["dpkg", "-s", "libb64-0d"],
                                               capture_output=True).returncode:
        pytest.fail("Debian's libb64-0d is missing (make setup installs it)")
    result = subprocess.run(
        [str(perf_analyzer()), "-m", "embed", "-u", real_server.host_port, "-i", "http",
         "--string-data", "how to find cheap flights to paris", "-b", "1",
         "--concurrency-range", "4", "--measurement-mode", "count_windows",
         "--measurement-request-count", "200", "--max-trials", "3",
         "--stability-percentage", "999", "--percentile", "99", "-v"],
        capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout
    # the server-side breakdown comes from our statistics extension
    assert "Server:" in result.stdout and "Inference count:" in result.stdout
    assert "compute infer" in result.stdout


def test_one_long_text_does_not_hold_other_clients(real_server: RunningServer) -> None:
    # A tokenizer reads a text whole and truncates after: 7 MB held every client, health
    # probes included.
    import threading
    import time

    text = "play some jazz " * (7 * 1024 * 1024 // 15)
    took: list[float] = []

    def big() -> None:
        started = time.monotonic()
        answer = httpx.post(f"{real_server.url}/v2/models/embed/infer", timeout=120, json={
            "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]})
        took.append(time.monotonic() - started)
        assert answer.status_code == 200, answer.text

    sender = threading.Thread(target=big)
    probes: list[float] = []
    with httpx.Client(base_url=real_server.url, timeout=30) as client:
        sender.start()
        while sender.is_alive():
            started = time.monotonic()
            assert client.get("/v2/health/live").status_code == 200
            probes.append(time.monotonic() - started)
            time.sleep(0.02)
    sender.join()
    # 4-5 s for both on this host before (the text was tokenized whole, holding the GIL);
    # 0.09 s after (cut at 16 characters a token the model reads).
    assert took and took[0] < 2.0 and max(probes, default=0.0) < 1.0, (took, probes)


def test_the_binary_header_s_length_may_carry_whitespace(real_server: RunningServer) -> None:
    import socket

    body, headers = binary_body([b"play some jazz"])
    length = headers["inference-header-content-length"]
    with socket.create_connection(("127.0.0.1", real_server.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/embed/infer HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     b"connection: close\r\ncontent-length: %d\r\n"
                     b"inference-header-content-length:  %s \r\n\r\n"  # RFC 9110 5.5
                     % (len(body), length.encode()) + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
