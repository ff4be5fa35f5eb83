"""`POST /v1/rerank` (and Infinity's `/rerank`), as Cohere and Jina shape it, over any model
that scores pairs of texts (`pipeline: pair_scoring`, which answers `PairScores`).

`{"model", "query", "documents", "top_n"?, "return_documents"?}` -> `{"model", "results":
[{"index", "relevance_score", "document"?: {"text"}}], "usage"}`: each document scored with the
query as one pair of the model's batch, best first, the first `top_n` (default: all).
Documents are strings or `{"text": ...}` objects (other keys of an object are the client's
own and ignored). `return_documents` defaults to false, as Cohere's and Infinity's do.

Every malformed field is a 400 in OpenAI's error object with the field as `param`, and so is
an unknown one (a misspelt `topn` was ignored, and every document returned); Cohere's length
limits (`max_chunks_per_doc`, `max_tokens_per_doc`) are taken and not needed: a pair is cut to
the model's `max_sequence_length`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from queryserve.api import Inputs, PairScores, as_json, decode_texts, is_blank
from queryserve.server.http import Request, Response
from queryserve.server.openai_protocol import about, invalid, model_for
from queryserve.server.routing import Router, json_body, json_response
from queryserve.server.state import ServerState

FIELDS = ("model", "query", "documents", "top_n", "return_documents", "max_chunks_per_doc",
          "max_tokens_per_doc")
EXAMPLE = ('{"model": "duplicates", "query": "sony cyber-shot dsc-w120", "documents": '
           '["sony dscw120p 7.2mp digital camera", {"text": "canon powershot a590"}], '
           '"top_n": 1}')


def add_routes(router: Router, state: ServerState) -> None:
    routes = RerankRoutes(state)
    router.add("POST", "/v1/rerank", routes.rerank)
    router.add("POST", "/rerank", routes.rerank)


class RerankRoutes:
    """The rerank route's handler over the server's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def rerank(self, request: Request) -> Response:
        body = json_body(request, EXAMPLE)
        if unknown := [str(field) for field in body if field not in FIELDS]:
            raise invalid(f"unknown field '{unknown[0][:80]}'; /v1/rerank takes "
                          f"{', '.join(FIELDS)}", unknown[0][:80])
        name, model = model_for(self.state, body, PairScores, "/v1/rerank", EXAMPLE)
        with self.state.reading(model):
            query = _query(body.get("query"))
            documents = _documents(body.get("documents"))
            top_n = _top_n(body.get("top_n"), len(documents))
            return_documents = body.get("return_documents", False)
            if not isinstance(return_documents, bool):
                raise invalid(f"'return_documents' must be true or false, got "
                              f"{as_json(return_documents, 40)}", "return_documents")
        with about("documents"):
            scores = await self.state.infer(model, Inputs([query] * len(documents), documents))
        best = np.argsort(-scores.probabilities, kind="stable")[:top_n]
        return json_response({"model": name, "results": [
            _result(int(i), float(scores.probabilities[i]),
                    documents[i] if return_documents else None) for i in best],
            "usage": {"prompt_tokens": scores.tokens, "total_tokens": scores.tokens}})


def _query(raw: object) -> str:
    if not isinstance(raw, str) or is_blank(raw):  # "\u200b" was scored as a query
        raise invalid(f"'query' must be a non-empty string, e.g. {EXAMPLE}", "query")
    return raw


def _documents(raw: object) -> list[str]:
    """Each document's text: a string, or an object's `"text"`."""
    if not isinstance(raw, list):
        raise invalid("'documents' must be a list of strings or of {\"text\": ...} objects, "
                      f"e.g. {EXAMPLE}", "documents")
    with about("documents"):
        if not raw:
            raise invalid("'documents' is empty; send at least one document", "documents")
        texts = []
        for i, document in enumerate(raw):
            if isinstance(document, dict):
                if "text" not in document:
                    raise invalid(f"documents[{i}] is an object without \"text\"", "documents")
                document = document["text"]
            texts.append(document)
        return decode_texts(texts, "documents")


def _top_n(raw: object, count: int) -> int:
    """How many results to return: all by default; more than there are documents is all."""
    if raw is None:
        return count
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise invalid(f"'top_n' must be a positive integer, got {as_json(raw, 40)}", "top_n")
    return min(raw, count)


def _result(index: int, score: float, document: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"index": index, "relevance_score": score}
    if document is not None:
        result["document"] = {"text": document}
    return result
