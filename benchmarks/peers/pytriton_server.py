"""Peer: NVIDIA Triton (through nvidia-pytriton) serving a sentence-transformers callable.

Runs in ``.peers/venv-pytriton``. The bundled tritonserver's Python-backend stub links
``libpython3.11.so`` through ldconfig, which finds Debian's 3.11.2 rather than the venv's 3.11.7
and fails at model load (``'_thread.RLock' object has no attribute '_recursion_count'``), so it
must start with ``LD_LIBRARY_PATH=<this python's LIBDIR>``; ``peers.py`` sets that. By hand:

    LD_LIBRARY_PATH=$(.peers/venv-pytriton/bin/python -c \
        'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))') \
    .peers/venv-pytriton/bin/python benchmarks/peers/pytriton_server.py --port 8700 \
        --model-dir MODEL_DIR --workspace .peers/pytriton-ws

KServe v2 over HTTP on 127.0.0.1:PORT (gRPC on PORT+1, metrics off):
``POST /v2/models/minilm/infer`` with
``{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["..."]}]}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the Hub: the model is local

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from sentence_transformers import SentenceTransformer

MODEL_NAME = "minilm"
MAX_BATCH_SIZE = 32
MAX_QUEUE_DELAY_US = 2000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True, help="HTTP; gRPC gets PORT+1")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--workspace", required=True, help="PyTriton's model store (default /tmp)")
    args = ap.parse_args()

    torch.set_num_threads(2)
    model = SentenceTransformer(args.model_dir, device="cpu")

    @batch  # type: ignore[untyped-decorator]
    def infer(text: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        queries = [row[0].decode("utf-8") for row in text]
        with torch.inference_mode():
            vectors = model.encode(queries, batch_size=len(queries), convert_to_numpy=True)
        return {"embedding": vectors.astype(np.float32)}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        grpc_address="127.0.0.1",
        grpc_port=args.port + 1,
        allow_metrics=False,
    )
    # PyTriton 0.7 guards the statistics/repository/... APIs with a random token; a fixed one
    # lets perf_analyzer and our own checks call them (header: triton-access-token).
    security = TritonSecurityConfig(access_token=os.environ.get("TRITON_TOKEN", "bench-token"))
    # PyTriton refuses a workspace that exists and leaves one it was given behind: start clean.
    shutil.rmtree(args.workspace, ignore_errors=True)
    with Triton(config=config, security_config=security, workspace=args.workspace) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=infer,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="embedding", dtype=np.float32, shape=(384,))],
            config=ModelConfig(
                max_batch_size=MAX_BATCH_SIZE,
                batcher=DynamicBatcher(max_queue_delay_microseconds=MAX_QUEUE_DELAY_US),
            ),
        )
        print("pytriton: serving", flush=True)
        triton.serve()  # blocks; PyTriton stops tritonserver on SIGINT/SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
