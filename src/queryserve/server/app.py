"""Routes: the KServe v2 / Triton HTTP API, OpenAI's embeddings route, `/v1/spell`,
`/v1/intent`, metrics.

Handlers stay short: parse, call the pipeline, encode. Every error is a `QueryServeError`
turned into a response in one place (`ServerApp.__call__`) using the error's own status.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from queryserve import __version__
from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import (
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    QueryServeError,
    Unavailable,
)
from queryserve.pipelines.base import decode_texts
from queryserve.pipelines.pair_scoring import PairScoring
from queryserve.repository import VERSION, Model, ModelRepository
from queryserve.scheduling.stats import request_recorded
from queryserve.search.pipeline import FILE as SEARCH_FILE
from queryserve.search.pipeline import MODEL as SEARCH_MODEL
from queryserve.search.pipeline import SearchConfig, Searcher
from queryserve.server import kserve
from queryserve.server.http import (
    IDLE_TIMEOUT_S,
    READ_TIMEOUT_S,
    Request,
    Response,
    json_error,
)
from queryserve.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from queryserve.server.metrics import render_metrics
from queryserve.spell.corrector import corrections
from queryserve.types import TRITON_DATA_TYPES, Array

log = logging.getLogger(__name__)

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]
_MODEL_ROUTE = re.compile(
    r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
    r"(?:/(?P<action>ready|config|stats|infer))?$")
_REPOSITORY_ROUTE = re.compile(r"^/v2/repository/models/(?P<model>[^/]+)/(?P<action>load|unload)$")


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = 8 * 1024 * 1024
    max_items: int = 1024
    """Items in one request: the rows of its batch (a text, or a pair of texts for a pair
    model), as Triton's batch dimension counts them."""
    read_timeout_s: float = READ_TIMEOUT_S
    """How long a client may go silent in the middle of a request before a 408."""
    idle_timeout_s: float = IDLE_TIMEOUT_S
    """How long a keep-alive connection may sit idle between requests."""


STATIC = Path(__file__).parent / "static"


def _column(texts: list[str]) -> Array:
    """Texts as a BYTES output of shape [n, 1]."""
    array = np.empty((len(texts), 1), dtype=object)
    array[:, 0] = texts
    return array


def _infer_response(body: bytes, header_length: int | None) -> Response:
    if header_length is None:
        return Response(200, body)
    return Response(200, body, "application/octet-stream",
                    [(kserve.HEADER_LENGTH, str(header_length))])


def _json(payload: object, status: int = 200) -> Response:
    return Response(status, orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY))


class ServerApp:
    def __init__(self, repository: ModelRepository, limits: Limits = Limits()) -> None:
        self.repository = repository
        self.limits = limits
        self.loading = True  # until the repository's first load is done
        self.searcher: Searcher | None = None  # see load_search
        self.search_error: QueryServeError = Unavailable("the search pipeline is loading")
        get: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/v2": self.server_metadata,
            "/v2/health/live": self.live,
            "/v2/health/ready": self.ready,
            "/v2/models/stats": self.all_stats,
            "/metrics": self.metrics,
            "/": self.page("index.html"),
            "/dashboard": self.page("dashboard.html"),
        }
        post: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/v1/embeddings": self.openai_embeddings,
            "/v1/spell": self.spell,
            "/v1/intent": self.intent,
            "/v1/duplicates": self.duplicates,
            "/v1/search": self.search,
            "/v2/repository/index": self.repository_index,
        }
        self.routes = {"GET": get, "POST": post}

    async def __call__(self, request: Request) -> Response:
        try:
            return await self.route(request)
        except QueryServeError as exc:
            response = json_error(exc.http_status, exc.message)
            if isinstance(exc, Overloaded):
                response.headers.append(("retry-after", str(exc.retry_after_s)))
            elif isinstance(exc, MethodNotAllowed):
                response.headers.append(("allow", exc.allow))
            return response
        except Exception:
            log.exception("error answering %s %s", request.method, request.path)
            return json_error(500, "internal server error")

    async def route(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        handler = self.routes.get(request.method, {}).get(path)
        if handler is not None:
            return await handler(request)
        if match := _MODEL_ROUTE.match(path):
            return await self.model_route(request, match["model"], match["version"],
                                          match["action"])
        if match := _REPOSITORY_ROUTE.match(path):
            if request.method != "POST":
                raise MethodNotAllowed(f"use POST on {path}", "POST")
            return await self.repository_action(match["model"], match["action"])
        if allowed := [method for method, routes in self.routes.items() if path in routes]:
            raise MethodNotAllowed(f"{request.method} is not allowed on {path}",
                                   ", ".join(allowed))
        raise NotFound(f"no route {request.method} {path}")

    # -- server -------------------------------------------------------------------------------

    @staticmethod
    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        """A page of the web UI: one self-contained HTML file, read once (no build step)."""
        body = (STATIC / name).read_bytes()

        async def serve_page(request: Request) -> Response:
            return Response(200, body, "text/html; charset=utf-8")

        return serve_page

    async def server_metadata(self, request: Request) -> Response:
        return _json({"name": "queryserve", "version": __version__, "extensions": EXTENSIONS})

    async def live(self, request: Request) -> Response:
        return Response(200)

    async def ready(self, request: Request) -> Response:
        names = self.repository.names()
        ready = not self.loading and all(n in self.repository.models for n in names)
        return Response(200 if ready else 503)

    async def metrics(self, request: Request) -> Response:
        return Response(200, render_metrics(self.repository), METRICS_CONTENT_TYPE)

    async def all_stats(self, request: Request) -> Response:
        return _json({"model_stats": [m.stats.as_triton_json(m.name, VERSION)
                                      for m in self.repository.models.values()]})

    async def repository_index(self, request: Request) -> Response:
        return _json(self.repository.index())

    async def repository_action(self, name: str, action: str) -> Response:
        loop = asyncio.get_running_loop()
        if action == "load":
            await loop.run_in_executor(None, self.repository.load, name)
        else:
            if name not in self.repository.names() and name not in self.repository.models:
                raise NotFound(f"model '{name}' is not in the repository")
            self.repository.unload(name)
        return Response(200)

    # -- models -------------------------------------------------------------------------------

    async def model_route(self, request: Request, name: str, version: str | None,
                          action: str | None) -> Response:
        if name == SEARCH_MODEL and name not in self.repository.names():
            return await self.search_model_route(request, version, action)
        if action == "ready":
            if request.method != "GET":
                raise MethodNotAllowed(f"use GET on {request.path}", "GET")
            ready = name in self.repository.models and version in (None, VERSION)
            return Response(200 if ready else 400 if name in self.repository.names() else 404)
        model = self.repository.get(name, version)
        if action == "infer":
            if request.method != "POST":
                raise MethodNotAllowed(f"use POST to infer with model '{name}'", "POST")
            return await self.infer(request, model)
        if request.method != "GET":
            raise MethodNotAllowed(f"use GET on {request.path}", "GET")
        if action == "config":
            return _json(triton_config(model.config, model.threads))
        if action == "stats":
            return _json({"model_stats": [model.stats.as_triton_json(name, VERSION)]})
        return _json(model_metadata(model.config))

    async def infer(self, request: Request, model: Model) -> Response:
        with request_recorded(model.stats):
            parsed = kserve.decode_infer_request(request.body, request.headers, model.config)
            texts, pairs = self._texts(parsed.inputs, model)
            result = await model.pipeline.infer(texts, parsed.timeout_s, pairs)
            body, header_length = kserve.encode_infer_response(
                model.config, VERSION, parsed,
                {model.config.outputs[0].name: result.output, **result.extra})
        return _infer_response(body, header_length)

    async def search_model_route(self, request: Request, version: str | None,
                                 action: str | None) -> Response:
        """The search pipeline as a KServe v2 model (Triton's ensemble): metadata, readiness,
        config (its steps) and inference, a query per row."""
        if version not in (None, "", VERSION):
            raise NotFound(f"model '{SEARCH_MODEL}' has no version '{version}'; it has version "
                           f"{VERSION}")
        if action == "ready":
            if request.method != "GET":
                raise MethodNotAllowed(f"use GET on {request.path}", "GET")
            return Response(200 if self.searcher is not None and self.searcher.ready()
                            else 400)
        if self.searcher is None:
            raise self.search_error
        config = self.searcher.model_config
        if action == "infer":
            if request.method != "POST":
                raise MethodNotAllowed(f"use POST to infer with model '{SEARCH_MODEL}'",
                                       "POST")
            parsed = kserve.decode_infer_request(request.body, request.headers, config)
            queries = decode_texts(self._items(parsed.inputs["query"]), "input 'query'")
            answers = await asyncio.gather(*(self.searcher.search(q) for q in queries))
            body, header_length = kserve.encode_infer_response(config, VERSION, parsed, {
                "corrected": _column([a["corrected"] for a in answers]),
                "intent": _column([(a["intent"] or {}).get("intent", "") for a in answers]),
                "results": _column([orjson.dumps(a["results"]).decode() for a in answers])})
            return _infer_response(body, header_length)
        if request.method != "GET":
            raise MethodNotAllowed(f"use GET on {request.path}", "GET")
        if action == "config":
            return _json({"name": SEARCH_MODEL, "platform": "ensemble",
                          "max_batch_size": config.max_batch_size,
                          "ensemble_scheduling": {"step": [
                              {"model_name": m, "model_version": -1}
                              for m in self.searcher.steps()]}})
        if action == "stats":
            raise NotFound(f"model '{SEARCH_MODEL}' keeps no statistics of its own; its steps "
                           f"do: {', '.join(self.searcher.steps())}")
        return _json(model_metadata(config))

    def _texts(self, inputs: dict[str, list[bytes | str] | Array],
               model: Model) -> tuple[list[str], list[str] | None]:
        """The first input's texts, and the second's for a pair model (same count)."""
        specs = model.config.inputs
        texts = decode_texts(self._items(inputs[specs[0].name]), f"input '{specs[0].name}'")
        if len(specs) < 2:
            return texts, None
        pairs = decode_texts(self._items(inputs[specs[1].name]), f"input '{specs[1].name}'")
        if len(pairs) != len(texts):
            raise InvalidInput(f"inputs '{specs[0].name}' and '{specs[1].name}' must hold the "
                               f"same number of texts; got {len(texts)} and {len(pairs)}")
        return texts, pairs

    def _items(self, items: list[bytes | str] | Array) -> list[bytes | str]:
        if len(items) > self.limits.max_items:
            raise PayloadTooLarge(f"the request has {len(items)} items; at most "
                                  f"{self.limits.max_items} are allowed per request")
        return list(items)

    def _model_for(self, name: object, pipelines: tuple[str, ...], route: str,
                   example: str) -> Model:
        """The model a JSON route's `"model"` names, if it is of a pipeline the route serves."""
        if not isinstance(name, str):
            raise InvalidInput(f"'model' must name a model, e.g. \"{example}\"")
        model = self.repository.get(name)
        if model.config.pipeline not in pipelines:
            raise InvalidInput(f"model '{name}' is a {model.config.pipeline} model; "
                               f"{route} serves {' and '.join(pipelines)} models only")
        return model

    async def openai_embeddings(self, request: Request) -> Response:
        body = kserve.parse_json(request.body)
        if not isinstance(body, dict):
            raise InvalidInput("the body must be a JSON object with 'model' and 'input'")
        model = self._model_for(body.get("model"), ("text_embedding",), "/v1/embeddings",
                               "embed")
        name = model.name
        with request_recorded(model.stats):
            raw = body.get("input")
            if not raw or not isinstance(raw, str | list):
                raise InvalidInput("'input' must be a non-empty string or list of strings")
            texts = decode_texts(self._items([raw] if isinstance(raw, str) else raw), "input")
            encoding = body.get("encoding_format", "float")
            if encoding not in ("float", "base64"):
                raise InvalidInput(f"encoding_format {encoding!r} is not supported; use "
                                   "'float' or 'base64'")
            dimensions = body.get("dimensions")
            width = model.config.outputs[0].dims[-1]
            if dimensions not in (None, width):
                raise InvalidInput(f"model '{name}' returns {width} dimensions; "
                                   f"'dimensions' {dimensions!r} is not supported")
            result = await model.pipeline.infer(texts)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64"
                 else v}
                for i, v in enumerate(result.output)]
        return _json({"object": "list", "data": data, "model": name,
                      "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens}})

    async def spell(self, request: Request) -> Response:
        """`{"queries": [...]}` -> `{"corrections": [{query, corrected, changed, score}]}`,
        through model `spell` (or the spelling or text2text model named by `"model"`, e.g.
        `spell-seq2seq`) and its batcher."""
        body = kserve.parse_json(request.body)
        if not isinstance(body, dict) or not isinstance(body.get("queries"), list):
            raise InvalidInput('the body must be a JSON object with "queries": a list of '
                               'strings, e.g. {"queries": ["taylor swfit"]}')
        model = self._model_for(body.get("model", "spell"), ("spelling", "text2text"), "/v1/spell",
                               "spell")
        with request_recorded(model.stats):
            queries = decode_texts(self._items(body["queries"]), "queries")
            if not queries:
                raise InvalidInput("'queries' is empty; send at least one query")
            result = await model.pipeline.infer(queries)
        return _json({"corrections": [
            c.as_json()
            for c in corrections(queries, result.output[:, 0], result.extra.get("score"))]})

    def load_search(self) -> None:
        """The search pipeline, if the repository declares one, with its vector indexes in
        memory (loaded on the first search instead, they would make that search slow)."""
        folder = self.repository.root / "search"
        if not (folder / SEARCH_FILE).is_file():
            self.search_error = NotFound(
                f"this repository declares no search pipeline ({folder / SEARCH_FILE}); "
                "`queryserve prepare` makes the default one")
            return
        try:
            searcher = Searcher(self.repository, SearchConfig.load(folder))
            searcher.load()
        except QueryServeError as exc:
            log.error("search pipeline not loaded: %s", exc.message)
            self.search_error = Unavailable(f"the search pipeline is not loaded: "
                                            f"{exc.message}")
            return
        self.searcher = searcher

    async def search(self, request: Request) -> Response:
        """`{"query", "k", "catalog", "spell"}` -> spell -> embed -> ANN, with intent alongside:
        `{"corrected", "intent", "results": [{"id", "title", "performer_or_brand", "score"}],
        "timings_ms": {stage: ms}}`."""
        body = kserve.parse_json(request.body)
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) \
                or not body["query"].strip():
            raise InvalidInput('the body must be a JSON object with "query": a non-empty '
                               'string, e.g. {"query": "taylor swfit", "k": 10, '
                               '"catalog": "songs"}')
        if self.searcher is None:
            raise self.search_error
        return _json(await self.searcher.search(body["query"], body.get("k"),
                                                body.get("catalog", "songs"),
                                                body.get("spell", True)))

    async def intent(self, request: Request) -> Response:
        """`{"queries": [...], "top_k": 3}` -> `{"results": [{"query", "intents": [{"intent",
        "score"}]}]}`, the k likeliest labels of model `intent` (or the text_classification
        model named by `"model"`), most likely first."""
        body = kserve.parse_json(request.body)
        if not isinstance(body, dict) or not isinstance(body.get("queries"), list):
            raise InvalidInput('the body must be a JSON object with "queries": a list of '
                               'strings, e.g. {"queries": ["wake me up at seven"], "top_k": 3}')
        top_k = body.get("top_k", 1)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise InvalidInput(f"'top_k' must be a positive integer, got {top_k!r}")
        model = self._model_for(body.get("model", "intent"), ("text_classification",),
                                "/v1/intent", "intent")
        with request_recorded(model.stats):
            queries = decode_texts(self._items(body["queries"]), "queries")
            if not queries:
                raise InvalidInput("'queries' is empty; send at least one query")
            result = await model.pipeline.infer(queries)
        probabilities = result.output
        names = model.config.labels(probabilities.shape[1])
        best = np.argsort(-probabilities, axis=1, kind="stable")[:, :top_k]
        return _json({"results": [
            {"query": q, "intents": [{"intent": names[j], "score": float(probabilities[i, j])}
                                     for j in best[i]]}
            for i, q in enumerate(queries)]})

    async def duplicates(self, request: Request) -> Response:
        """`{"pairs": [[a, b], ...]}` -> `{"results": [{"probability", "duplicate"}]}`: whether
        each pair of product texts names one product, by model `duplicates` (or the
        pair_scoring model named by `"model"`) at its threshold (or `"threshold"`)."""
        body = kserve.parse_json(request.body)
        example = ('e.g. {"pairs": [["sony cyber-shot dsc-w120 pink", '
                   '"sony dscw120p 7.2mp digital camera"]]}')
        if not isinstance(body, dict) or not isinstance(body.get("pairs"), list):
            raise InvalidInput(f'the body must be a JSON object with "pairs": a list of '
                               f'[text, text] pairs, {example}')
        model = self._model_for(body.get("model", "duplicates"), ("pair_scoring",),
                                "/v1/duplicates", "duplicates")
        assert isinstance(model.pipeline, PairScoring)  # _model_for admitted pair_scoring only
        threshold = body.get("threshold", model.pipeline.threshold)
        if not isinstance(threshold, int | float) or isinstance(threshold, bool) \
                or not 0 <= threshold <= 1:
            raise InvalidInput(f"'threshold' must be a number from 0 to 1, got {threshold!r}")
        with request_recorded(model.stats):
            pairs = self._items(body["pairs"])
            if not pairs:
                raise InvalidInput(f"'pairs' is empty; send at least one pair, {example}")
            texts: list[list[str]] = []
            for i, pair in enumerate(pairs):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise InvalidInput(f"pairs[{i}] must be a list of two texts, got "
                                       f"{str(pair)[:80]}")
                texts.append(decode_texts(pair, f"pairs[{i}]"))
            lefts, rights = [a for a, _ in texts], [b for _, b in texts]
            result = await model.pipeline.infer(lefts, None, rights)
        return _json({"threshold": threshold, "results": [
            {"probability": float(p), "duplicate": bool(p >= threshold)}
            for p in result.output[:, 0]]})


def model_metadata(config: ModelConfig) -> dict[str, object]:
    def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, object]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": [-1, *s.dims]} for s in specs]

    return {"name": config.name, "versions": [VERSION], "platform": _platform(config),
            "inputs": tensors(config.inputs), "outputs": tensors(config.outputs)}


def _platform(config: ModelConfig) -> str:
    return "onnxruntime_onnx" if config.backend == "onnxruntime" else config.backend


def triton_config(config: ModelConfig, threads: int) -> dict[str, object]:
    """The model's configuration in Triton's JSON form (perf_analyzer reads it)."""
    batching = config.dynamic_batching

    def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, object]]:
        return [{"name": s.name, "data_type": TRITON_DATA_TYPES[s.datatype], "dims": list(s.dims)}
                for s in specs]

    return {
        "name": config.name,
        "platform": _platform(config),
        "backend": config.backend,
        "max_batch_size": config.max_batch_size,
        "input": tensors(config.inputs),
        "output": tensors(config.outputs),
        "dynamic_batching": {
            "preferred_batch_size": list(batching.preferred_batch_size),
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "default_queue_policy": {
                "max_queue_size": batching.max_queue_size,
                "default_timeout_microseconds": batching.default_timeout_microseconds,
            },
            "max_batch_tokens": batching.max_batch_tokens,
            "batch_overhead_tokens": batching.batch_overhead_tokens,
        },
        "instance_group": [{"count": config.instance_group.count, "kind": "KIND_CPU"}],
        "response_cache": {"enable": config.response_cache.enable},
        "parameters": {**{k: {"string_value": str(v)} for k, v in config.parameters.items()},
                       "intra_op_thread_count": {"string_value": str(threads)}},
        "model_warmup": [{"name": w.name, "batch_size": w.batch_size}
                         for w in config.model_warmup],
    }
