"""The task routes, JSON for people and web pages: `/v1/spell`, `/v1/intent`, `/v1/duplicates`,
`/v1/search`.

Each is decode -> `state.infer(model, ...)` -> encode: a JSON object with the request's texts
and options, the model it names (`"model"`: a name or an alias, or the route's default) checked
to be of the route's kind, and the model's typed answer written out. What the answer means (the
likeliest labels, whether a correction changed the query, a pair's decision at its threshold)
the model has decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from queryserve.api import (
    Classifications,
    Corrections,
    Inputs,
    Label,
    PairScores,
    SearchAnswer,
    Searches,
    is_blank,
)
from queryserve.errors import InvalidInput
from queryserve.model import Model
from queryserve.server.http import Request, Response
from queryserve.server.routing import Router, json_body, json_response
from queryserve.server.state import ServerState

T = TypeVar("T")

SPELL = '{"queries": ["taylor swfit"]}'
INTENT = '{"queries": ["wake me up at seven"], "top_k": 3}'
DUPLICATES = ('{"pairs": [["sony cyber-shot dsc-w120 pink", '
              '"sony dscw120p 7.2mp digital camera"]]}')
SEARCH = '{"query": "taylor swfit", "k": 10, "catalog": "songs"}'


def add_routes(router: Router, state: ServerState) -> None:
    routes = TaskRoutes(state)
    router.add("POST", "/v1/spell", routes.spell)
    router.add("POST", "/v1/intent", routes.intent)
    router.add("POST", "/v1/duplicates", routes.duplicates)
    router.add("POST", "/v1/search", routes.search)


class TaskRoutes:
    """The task routes' handlers, one method each, over the server's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def spell(self, request: Request) -> Response:
        """`{"queries": [...]}` -> `{"corrections": [{query, corrected, changed, score}]}`, by
        model `spell` or the spelling or text2text model named by `"model"`."""
        body = self.body(request, SPELL, "/v1/spell", "queries")
        corrector = self.model(body, "spell", Corrections, "/v1/spell")
        with self.state.reading(corrector):
            queries = self.texts(body, "queries", SPELL)
        result = await self.state.infer(corrector, Inputs(queries))
        return json_response({"corrections": result.corrections})

    async def intent(self, request: Request) -> Response:
        """`{"queries": [...], "top_k": 3}` -> `{"results": [{"query", "intents": [{"intent",
        "score", "confident"}]}]}`, the likeliest labels first."""
        body = self.body(request, INTENT, "/v1/intent", "queries", "top_k")
        classifier = self.model(body, "intent", Classifications, "/v1/intent")
        with self.state.reading(classifier):
            queries = self.texts(body, "queries", INTENT)
        result = await self.state.infer(classifier, Inputs(queries,
                                                        parameters=_options(body, "top_k")))
        return json_response({"results": [
            {"query": q, "intents": _labels(top)}
            for q, top in zip(queries, result.top, strict=True)]})

    async def duplicates(self, request: Request) -> Response:
        """`{"pairs": [[a, b], ...], "threshold"?}` -> `{"threshold", "results":
        [{"probability", "duplicate"}]}`: whether each pair of product texts names one
        product."""
        body = self.body(request, DUPLICATES, "/v1/duplicates", "pairs", "threshold")
        scorer = self.model(body, "duplicates", PairScores, "/v1/duplicates")
        with self.state.reading(scorer):
            pairs = self.pairs(body)
        result = await self.state.infer(scorer, Inputs([a for a, _ in pairs],
                                                       [b for _, b in pairs],
                                                       _options(body, "threshold")))
        return json_response({"threshold": result.threshold, "results": [
            {"probability": float(p), "duplicate": d}
            for p, d in zip(result.probabilities, result.duplicates, strict=True)]})

    async def search(self, request: Request) -> Response:
        """`{"query", "k", "catalog", "spell"}` -> spell -> embed -> ANN, with intent
        alongside: `{"query", "corrected", "changed", "spell_score", "searched", "intent":
        {"intent", "score", "confident"}, "catalog", "results": [{"id", "title",
        "performer_or_brand", "score"}], "timings_ms": {step: ms}, "skipped"}`."""
        body = self.body(request, SEARCH, "/v1/search", "query", "k", "catalog", "spell")
        searcher = self.model(body, "search", Searches, "/v1/search")
        with self.state.reading(searcher):
            query = _search_query(body)
        result = await self.state.infer(searcher, Inputs([query], parameters=_options(
            body, "k", "catalog", "spell")))
        return json_response(_search_answer(result.answers[0]))

    @staticmethod
    def body(request: Request, example: str, route: str, *fields: str) -> dict[str, Any]:
        """The body as a JSON object of the route's fields (and `model`): a misspelled option
        (`"topk": 3`) is refused, where it was answered with the default, as if heard."""
        body = json_body(request, example)
        allowed = (*fields, "model")
        if unknown := [str(name) for name in body if name not in allowed]:
            raise InvalidInput(f"unknown field '{unknown[0][:80]}'; {route} takes "
                               f"{', '.join(allowed)}")
        return body

    def model(self, body: dict[str, Any], default: str, kind: type[T], route: str) -> Model[T]:
        """The model the body names (`"model"`: a name or an alias, or the route's
        `default`), of the route's kind."""
        name = body.get("model", default)
        if not isinstance(name, str):
            raise InvalidInput(f"'model' must name a model, e.g. \"{default}\"")
        try:
            model = self.state.model(name)
        except InvalidInput:  # not even a model name ("../x"): not one this server has, as
            raise self.state.unknown_model(name) from None  # the OpenAI routes answer (404)
        return model.answering(kind, route)

    def texts(self, body: dict[str, Any], field: str, example: str) -> list[str]:
        if not isinstance(body.get(field), list):
            raise InvalidInput(f'the body must be a JSON object with "{field}": a list, e.g. '
                               f"{example}")
        return self.state.texts(body[field], field)

    def pairs(self, body: dict[str, Any]) -> list[list[str]]:
        """The body's `"pairs"`: each a list of two texts."""
        pairs = body.get("pairs")
        if not isinstance(pairs, list):
            raise InvalidInput(f'the body must be a JSON object with "pairs": a list of '
                               f"[text, text] pairs, e.g. {DUPLICATES}")
        if not pairs:
            raise InvalidInput(f"'pairs' is empty; send at least one pair, e.g. {DUPLICATES}")
        for i, pair in enumerate(pairs):
            if not isinstance(pair, list) or len(pair) != 2:
                raise InvalidInput(f"pairs[{i}] must be a list of two texts, got "
                                   f"{str(pair)[:80]}")
            self.state.texts(pair, f"pairs[{i}]")
        return pairs


def _options(body: dict[str, Any], *names: str) -> dict[str, object]:
    return {name: body[name] for name in names if name in body}


def _labels(labels: Sequence[Label]) -> list[dict[str, object]]:
    """`confident`: the score reaches the model's calibrated threshold (always true for a model
    without a calibration)."""
    return [{"intent": label.name, "score": label.score, "confident": label.confident}
            for label in labels]


def _search_answer(a: SearchAnswer) -> dict[str, object]:
    return {"query": a.query, "corrected": a.corrected, "changed": a.changed,
            "spell_score": a.spell_score, "searched": a.searched,
            "intent": _labels([a.intent])[0] if a.intent else None, "catalog": a.catalog,
            "results": a.results, "timings_ms": a.timings_ms, "skipped": a.skipped}


def _search_query(body: dict[str, Any]) -> str:
    query = body.get("query")
    if not isinstance(query, str) or is_blank(query):  # "\u0000" was searched
        raise InvalidInput(f'the body must be a JSON object with "query": a non-empty string, '
                           f"e.g. {SEARCH}")
    return query
