"""Peer: Ray Serve with ``@serve.batch`` in front of sentence-transformers (torch fp32).

Runs in ``.peers/venv-ray`` and ONLY inside a loopback-only network namespace: the Serve replica
opens a wildcard (``*:PORT``) listener even when every address it is given is 127.0.0.1.
``peers.py`` starts it that way; by hand:

    ip netns exec qs-peers .peers/venv-ray/bin/python benchmarks/peers/ray_serve_app.py \
        --port 8700 --model-dir MODEL_DIR --temp-dir .peers/ray-tmp

It speaks the OpenAI embeddings API (``POST /v1/embeddings``, ``{"model": .., "input": [..]}``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the Hub: the model is local
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
from ray import serve
from starlette.requests import Request

MAX_BATCH_SIZE = 32
BATCH_WAIT_S = 0.002


# max_ongoing_requests: Serve's default (5) would queue requests in the proxy and starve the
# batcher; 256 lets a whole batch's worth of single-query requests reach it.
@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
class Embedder:
    def __init__(self, model_dir: str) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(2)
        self.model = SentenceTransformer(model_dir, device="cpu")

    # One text per call: Serve gathers the calls into a list. (Passing a list per call hands
    # sentence-transformers a list of lists and fails.)
    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)  # type: ignore[untyped-decorator]
    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
        return [v.tolist() for v in vectors]

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        vectors = await asyncio.gather(*(self.embed(t) for t in texts))
        return {
            "object": "list",
            "model": body.get("model", "minilm"),
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
        }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--temp-dir", required=True, help="Ray's session files (default is /tmp/ray)")
    args = ap.parse_args()

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=os.path.abspath(args.temp_dir),
    )
    stop = threading.Event()
    # After ray.init, which installs its own SIGTERM handler: ours shuts Serve and Ray down in
    # order (Ray then stops its GCS, raylet and workers; peers.py kills whatever is left).
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        # serve.deployment turned the class into a Deployment (untyped here, hence the ignore).
        app = Embedder.bind(args.model_dir)  # type: ignore[attr-defined]
        serve.run(app, route_prefix="/v1/embeddings")
        print("ray serve: ready", flush=True)
        while not stop.wait(1.0):  # a timed wait, so the signal handler gets to run
            pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
