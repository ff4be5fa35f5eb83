"""`POST /v1/rerank` end to end: a real server, the repository's real pair model
(`duplicates`), httpx as the client."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import RunningServer

QUERY = "sony cyber-shot dsc-w120 digital camera pink"
DOCUMENTS = ["canon powershot a590 is 8mp digital camera",
             "sony dscw120p 7.2mp digital camera pink",
             "apple ipod nano 8gb silver",
             "sony cyber-shot dsc-w120 pink"]


def rerank(server: RunningServer, path: str = "/v1/rerank", **body: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=30,
                      json={"model": "duplicates", "query": QUERY, "documents": DOCUMENTS,
                            **body})


def probabilities(server: RunningServer) -> list[float]:
    """The same pairs' scores from the model's own task route."""
    response = httpx.post(f"{server.url}/v1/duplicates", timeout=30,
                          json={"pairs": [[QUERY, d] for d in DOCUMENTS]})
    return [r["probability"] for r in response.json()["results"]]


def test_every_document_scored_best_first(real_server: RunningServer) -> None:
    response = rerank(real_server)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "duplicates"
    results = answer["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    expected = probabilities(real_server)
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-5)
        assert "document" not in r  # not asked for
    # The two listings of the queried camera first, the other camera and the iPod far below.
    assert {r["index"] for r in results[:2]} == {1, 3}
    assert results[1]["relevance_score"] > 0.5 > results[2]["relevance_score"]
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] > 0


def test_top_n_and_documents_returned(real_server: RunningServer) -> None:
    every = rerank(real_server).json()["results"]
    top = rerank(real_server, top_n=2, return_documents=True).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in every[:2]]
    assert [r["document"] for r in top] == [{"text": DOCUMENTS[r["index"]]} for r in top]
    assert len(rerank(real_server, top_n=10).json()["results"]) == len(DOCUMENTS)


def test_documents_as_objects_and_without_the_prefix(real_server: RunningServer) -> None:
    plain = rerank(real_server).json()["results"]
    objects = rerank(real_server, "/rerank",
                     documents=[{"text": d, "id": i} for i, d in enumerate(DOCUMENTS)])
    assert objects.status_code == 200, objects.text
    assert [r["index"] for r in objects.json()["results"]] == [r["index"] for r in plain]


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    ({"query": ""}, 400, "query", "'query' must be a non-empty string"),
    ({"query": ["sony"]}, 400, "query", "'query' must be a non-empty string"),
    ({"query": None}, 400, "query", "'query' must be a non-empty string"),
    # Nothing a model reads (it was scored, as the documents are not)
    ({"query": "\u200b"}, 400, "query", "'query' must be a non-empty string"),
    ({"query": "\u0000 \ufeff"}, 400, "query", "'query' must be a non-empty string"),
    ({"documents": []}, 400, "documents", "'documents' is empty"),
    ({"documents": "sony"}, 400, "documents", "'documents' must be a list"),
    ({"documents": ["sony", 5]}, 400, "documents", "documents[1] must be a string"),
    ({"documents": ["sony", " "]}, 400, "documents", "documents[1] is empty"),
    ({"documents": [{"title": "sony"}]}, 400, "documents",
     'documents[0] is an object without "text"'),
    ({"documents": [{"text": None}]}, 400, "documents", "documents[0] must be a string"),
    ({"documents": ["sony"] * 1025}, 413, "documents", "at most 1024"),
    ({"top_n": 0}, 400, "top_n", "'top_n' must be a positive integer"),
    ({"top_n": "2"}, 400, "top_n", "'top_n' must be a positive integer, got \"2\""),
    ({"top_n": True}, 400, "top_n", "'top_n' must be a positive integer"),
    ({"top_n": 1.5}, 400, "top_n", "'top_n' must be a positive integer"),
    ({"return_documents": "yes"}, 400, "return_documents", "must be true or false"),
    # A misspelt field was ignored: every document came back.
    ({"topn": 1}, 400, "topn", "unknown field 'topn'; /v1/rerank takes model, query"),
    ({"model": None}, 400, "model", "'model' must name a model"),
    ({"model": "embed"}, 400, "model", "serves pair_scoring models only"),
    ({"model": "nope"}, 404, "model", "unknown model 'nope'"),
])
def test_malformed_fields_are_4xx_naming_the_field(real_server: RunningServer,
                                                  body: dict[str, Any], status: int,
                                                  param: str, words: str) -> None:
    response = rerank(real_server, **body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("content", [b"", b"[]", b"{", b'"rerank"', b"\xff"])
def test_a_body_that_is_no_json_object_is_a_400(real_server: RunningServer,
                                                content: bytes) -> None:
    response = httpx.post(f"{real_server.url}/v1/rerank", content=content, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
