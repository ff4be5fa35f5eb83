"""`queryserve serve --prepare` (what `make run` does): the server answers at once and each
model as soon as `queryserve prepare` has built it, `embed` first; readiness stays 503 until the
last. A real server on 127.0.0.1 over the prepared repository with `spell` left to build (the
noisy channel: seconds), so one model really is prepared while the others serve."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import REPOSITORY, free_port
from tests.e2e.test_lifecycle import infer_body

ROOT = Path(__file__).resolve().parents[2]


def test_serve_prepare_answers_embed_before_the_last_model_is_built(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    for entry in REPOSITORY.iterdir():
        if entry.name != "spell":  # to be prepared by the server's `queryserve prepare`
            (repository / entry.name).symlink_to(entry)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--prepare", "--repository",
             str(repository), "--http", f"127.0.0.1:{port}", "--grpc", "off", "--workers", "1"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        embed_first: tuple[int, int] | None = None  # readiness and spell's, when embed answered
        deadline = time.monotonic() + 300
        with httpx.Client(base_url=url, timeout=10) as client:
            while time.monotonic() < deadline:
                assert server.poll() is None, log.read_text()
                try:
                    ready = client.get("/v2/health/ready").status_code
                    if embed_first is None and client.post(
                            "/v2/models/embed/infer",
                            json=infer_body("wake me up at seven")).status_code == 200:
                        embed_first = (ready, client.get("/v2/models/spell/ready").status_code)
                    if ready == 200:
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.05)
            assert embed_first is not None, log.read_text()
            # embed answered while the server was not ready and spell was not built yet
            assert embed_first[0] == 503 and embed_first[1] in (400, 404), embed_first
            assert client.get("/v2/health/ready").status_code == 200, log.read_text()
            corrected = client.post("/v1/spell", json={"queries": ["taylor swfit"]}).json()
            assert corrected["corrections"][0]["corrected"] == "taylor swift"
        assert (repository / "spell" / "model.yaml").is_file()  # built into this repository
        text = log.read_text()
        assert text.index("model 'embed' ready") < text.index("model 'spell' ready")
        assert "Traceback" not in text
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0
