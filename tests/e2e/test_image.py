"""The image `make image` builds, run as a cluster would run it: podman, the image's own non-root
user, a read-only root with a tmpfs at /tmp only, no capabilities, the API key from the
environment, ports published on 127.0.0.1. Real clients over KServe v2 HTTP, KServe v2 gRPC
(tritonclient) and OpenAI (the `openai` SDK); `podman stop` drains and the container exits 0.

Opt-in, since the build takes minutes: `QUERYSERVE_IMAGE_TESTS=1 .venv/bin/python -m pytest
tests/e2e/test_image.py`, after `make prepare`, on a Linux host with podman (as root on hosts
like CI's). It builds the image with deploy/image/build.sh (`make image` without `prepare`), which
reuses the base image and every unchanged layer. On a 2-core AMD EPYC: 104 s from nothing (97 s
of it the base and the build), about 30 s after a change to the sources, 15 s with nothing to
rebuild (README.md, "Container image").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc

from tests.conftest import REPOSITORY, ROOT, free_port

pytestmark = pytest.mark.skipif(
    os.environ.get("QUERYSERVE_IMAGE_TESTS") != "1",
    reason="builds and runs the container image (minutes): run with QUERYSERVE_IMAGE_TESTS=1 "
           "after `make prepare`, where podman works (see this module's docstring)")

IMAGE = os.environ.get("IMAGE", "localhost/queryserve:latest")
MAX_IMAGE_BYTES = 1_500_000_000
READY_WITHIN_S = 10.0
KEY = "image-test-key-0123456789"
QUERIES = ["wake me up at five am this week", "play some jazz", "olly what's the weather"]
HEADERS = {"authorization": f"Bearer {KEY}"}


def podman_env() -> dict[str, str]:
    """podman's settings as deploy/image/build.sh uses them (this machine's quirks)."""
    conf = os.environ.get("QUERYSERVE_CONTAINERS_CONF", "deploy/image/containers.conf")
    return {**os.environ, **({"CONTAINERS_CONF": str(ROOT / conf)} if conf else {})}


def podman(*args: str, check: bool = True, timeout_s: float = 120) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=False,
                          env=podman_env(), timeout=timeout_s)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout.strip()


@dataclass
class Container:
    name: str
    url: str
    grpc_address: str
    ready_s: float

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True,
                              check=False, env=podman_env(), timeout=30)
        return done.stdout + done.stderr


def run_container(*extra: str, command: tuple[str, ...] = ()) -> Container:
    """`podman run` as deploy/kubernetes/deployment.yaml runs the image, and the seconds from
    `podman run` to /v2/health/ready answering 200."""
    name = f"queryserve-test-{uuid.uuid4().hex[:8]}"
    http, grpc = free_port(), free_port()
    started = time.monotonic()
    podman("run", "--detach", "--name", name,
           "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=256m,mode=1777",
           "--cap-drop", "all", "--security-opt", "no-new-privileges",
           "--env", f"QUERYSERVE_API_KEY={KEY}",
           "--publish", f"127.0.0.1:{http}:8000", "--publish", f"127.0.0.1:{grpc}:8001",
           *extra, IMAGE, *command)
    container = Container(name, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", 0.0)
    deadline = started + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{container.url}/v2/health/ready", timeout=1).status_code == 200:
                container.ready_s = time.monotonic() - started
                return container
        except httpx.TransportError:
            pass
        if podman("inspect", "--format", "{{.State.Running}}", name) != "true":
            pytest.fail(f"the container exited before it was ready:\n{container.logs()}")
        time.sleep(0.05)
    pytest.fail(f"not ready 120 s after podman run:\n{container.logs()}")


def remove(container: Container) -> None:
    podman("rm", "--force", "--time", "0", container.name, check=False)


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install podman buildah runc ...)")
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default models are not prepared: run `make prepare` first")
    build = subprocess.run([str(ROOT / "deploy/image/build.sh")], cwd=ROOT, env={
        **os.environ, "IMAGE": IMAGE}, capture_output=True, text=True, check=False,
        timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"deploy/image/build.sh exited {build.returncode}:\n"
                    f"{build.stdout[-4000:]}\n{build.stderr[-4000:]}")
    return IMAGE


@pytest.fixture(scope="module")
def served(image: str) -> Iterator[Container]:
    """The image as built, its own command and user: the default repository, all 8 models."""
    container = run_container()
    yield container
    remove(container)


def test_the_image_is_small_serves_without_torch_and_runs_as_its_own_user(
        image: str, served: Container) -> None:
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
    assert size <= MAX_IMAGE_BYTES, f"{image} is {size / 1e9:.2f} GB"
    assert podman("image", "inspect", "--format", "{{.Config.User}}", image) == "10001:10001"
    assert podman("exec", served.name, "id", "-u") == "10001"
    found = podman("exec", served.name, "python3", "-c",
                   "import importlib.util as u; print([m for m in ('torch', 'transformers', "
                   "'matplotlib', 'pyarrow') if u.find_spec(m)])")
    assert found == "[]"
    assert podman("exec", served.name, "sh", "-c", "command -v gcc cc c++ || true") == ""


def test_ready_within_10_s_of_podman_run(served: Container) -> None:
    print(f"ready {served.ready_s:.2f} s after podman run")
    assert served.ready_s <= READY_WITHIN_S


def test_the_root_and_the_models_are_read_only(served: Container) -> None:
    for path in ("/srv/queryserve/model_repository/embed/model.onnx",
                 "/srv/queryserve/model_repository/new", "/opt/queryserve/new", "/new"):
        done = subprocess.run(["podman", "exec", served.name, "touch", path],
                              capture_output=True, text=True, env=podman_env(), check=False)
        assert done.returncode != 0, path
    # Serving wrote nothing, not even to /tmp (ONNX Runtime's telemetry store is off).
    assert podman("exec", served.name, "ls", "-A", "/tmp") == ""
    podman("exec", served.name, "touch", "/tmp/scratch")  # the one writable path


def test_kserve_v2_over_http_needs_the_key(served: Container) -> None:
    body = {"inputs": [{"name": "text", "shape": [len(QUERIES), 1], "datatype": "BYTES",
                        "data": QUERIES}]}
    url = f"{served.url}/v2/models/embed/infer"
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    answer = httpx.post(url, json=body, headers=HEADERS, timeout=30)
    assert answer.status_code == 200, answer.text
    output = answer.json()["outputs"][0]
    assert output["shape"] == [len(QUERIES), 384]
    vectors = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    ready = httpx.get(f"{served.url}/v2/models/spell-hybrid/ready", headers=HEADERS, timeout=5)
    assert ready.status_code == 200  # CTranslate2 and the noisy channel load in the image too


def test_kserve_v2_over_grpc(served: Container) -> None:
    client = triton_grpc.InferenceServerClient(served.grpc_address)
    assert client.is_server_ready(headers=HEADERS)
    texts = triton_grpc.InferInput("text", [len(QUERIES), 1], "BYTES")
    texts.set_data_from_numpy(np.array([[q.encode()] for q in QUERIES], dtype=object))
    scores = client.infer("intent", [texts], headers=HEADERS).as_numpy("probabilities")
    assert scores.shape == (len(QUERIES), 60)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-3)


def test_openai_embeddings(served: Container) -> None:
    sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0)
    response = sdk.embeddings.create(model="embed", input=QUERIES)
    assert [len(d.embedding) for d in response.data] == [384] * len(QUERIES)


def test_another_repository_mounted_read_only(served: Container) -> None:
    """The README's way to serve other models: mount them and pass --repository."""
    other = run_container(
        "--volume", f"{REPOSITORY / 'embed'}:/models/embed:ro",
        command=("queryserve", "serve", "--http", "0.0.0.0:8000", "--grpc", "0.0.0.0:8001",
                 "--repository", "/models"))
    try:
        index = httpx.post(f"{other.url}/v2/repository/index", headers=HEADERS, timeout=10)
        assert [m["name"] for m in index.json()] == ["embed"]
    finally:
        remove(other)


def test_sigterm_answers_every_accepted_request_then_exits_0(served: Container) -> None:
    """Last: `podman stop` (SIGTERM) with requests in the queue. Each is answered, at least one
    after the signal, and the container exits 0."""
    texts = [f"cheap flights from city {i} to the coast next weekend with a window seat "
             f"and extra legroom please" for i in range(512)]
    answered: list[tuple[int, float]] = []

    def send() -> None:
        sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0,
                            timeout=60)
        response = sdk.embeddings.create(model="embed", input=texts)
        answered.append((len(response.data), time.monotonic()))

    clients = [threading.Thread(target=send) for _ in range(8)]
    for thread in clients:
        thread.start()
    time.sleep(0.5)  # every request sent and accepted; the queue holds most of their texts
    stopped = time.monotonic()
    podman("stop", "--time", "40", served.name, timeout_s=60)
    for thread in clients:
        thread.join(timeout=60)
    state = json.loads(podman("inspect", "--format", "{{json .State}}", served.name))
    logs = served.logs()
    assert state["ExitCode"] == 0, logs[-3000:]
    assert "every accepted request answered" in logs, logs[-3000:]
    assert [n for n, _ in answered] == [len(texts)] * len(clients)
    assert max(t for _, t in answered) > stopped, "nothing was left to drain: send more"
