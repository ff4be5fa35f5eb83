"""OpenAI's embeddings and models routes, as the `openai` SDK calls them (and Infinity's
unprefixed twins, `/embeddings` and `/models`).

- `POST /v1/embeddings` over any `text_embedding` model: `model` names it (or an alias,
  `--served-model-name`), `input` is a string, a list of strings, or token ids of the model's
  own tokenizer (a list of ints, or a list of lists of ints: TEI's rule); `encoding_format`
  float or base64; `dimensions` only as the model's own width.
- `GET /v1/models` lists the loaded models and their aliases; `GET /v1/models/{id}` is one.

Errors are OpenAI's object (`openai_protocol`).
"""

from __future__ import annotations

import base64
from typing import Any

from queryserve.api import Embeddings, Inputs, as_json
from queryserve.errors import NotFound, Unavailable
from queryserve.model import AnyModel
from queryserve.server.http import Request, Response
from queryserve.server.openai_protocol import (
    DetailedError,
    about,
    find_model,
    invalid,
    model_for,
)
from queryserve.server.routing import Router, json_body, json_response
from queryserve.server.state import ServerState

EXAMPLE = '{"model": "embed", "input": ["play some jazz"]}'
OWNER = "queryserve"


def add_routes(router: Router, state: ServerState) -> None:
    routes = OpenAIRoutes(state)
    for prefix in ("/v1", ""):
        router.add("POST", prefix + "/embeddings", routes.embeddings)
        router.add("GET", prefix + "/models", routes.models)
        # An id may hold slashes (`--served-model-name BAAI/bge-small-en-v1.5=embed`).
        router.add_pattern("GET", prefix + r"/models/(?P<name>.+)", routes.one_model)


class OpenAIRoutes:
    """OpenAI's routes' handlers, one method each, over the server's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def embeddings(self, request: Request) -> Response:
        body = json_body(request, EXAMPLE)
        name, model = model_for(self.state, body, Embeddings, "/v1/embeddings", EXAMPLE)
        with self.state.reading(model):
            inputs = embedding_inputs(body.get("input"))
            encoding = body.get("encoding_format") or "float"  # null: not given, as OpenAI
            if encoding not in ("float", "base64"):
                raise invalid(f"encoding_format {as_json(encoding, 40)} is not supported; use "
                              "'float' or 'base64'", "encoding_format")
            width = model.config.outputs[0].dims[-1]
            dimensions = body.get("dimensions")
            if dimensions is not None and type(dimensions) is not int:  # "384" is not 384
                raise invalid(f"'dimensions' must be an integer, got "
                              f"{as_json(dimensions, 40)}", "dimensions")
            if dimensions not in (None, width):
                raise invalid(f"model '{name}' returns {width} dimensions; 'dimensions' "
                              f"{dimensions} is not supported", "dimensions")
        with about("input"):  # what the model refuses is in the input (a token id)
            result = await self.state.infer(model, inputs)
        return json_response(embeddings_answer(name, result, encoding == "base64"))

    async def models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [
            model_card(name, model) for name, model in self.state.served_models().items()]})

    async def one_model(self, request: Request, name: str) -> Response:
        # The SDK's `models.retrieve("BAAI/bge-small-en-v1.5")` sends the slash as %2F, which
        # the transport keeps (a path's %2F is not a separator): here it is one.
        name = name.replace("%2F", "/").replace("%2f", "/")
        try:
            model = find_model(self.state, name)
        except Unavailable as exc:  # not loaded: not listed, so not found (a 503 the SDK
            # retried, 2 s, for a model an operator unloaded)
            raise DetailedError(NotFound(exc.message), param="model",
                                code="model_not_found") from None
        return json_response(model_card(name, model))


def embedding_inputs(raw: object) -> Inputs:
    """`input` as OpenAI and TEI take it: a string, a list of strings, one row of token ids
    (a list of ints), or rows of them (a list of lists of ints). Anything else, mixed kinds
    included, is a 400 that names the item."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise invalid("'input' is empty; send a string, a list of strings or token ids"
                      if raw == [] else "'input' must be a string, a list of strings, or "
                      "token ids (a list of integers, or a list of lists of integers)", "input")
    first = raw[0]
    with about("input"):
        if _is_token_id(first):
            return Inputs((), token_ids=[_token_row(raw, "input")])
        if isinstance(first, list):
            return Inputs((), token_ids=[_token_row(row, f"input[{i}]")
                                         for i, row in enumerate(raw)])
        return Inputs(ServerState.texts(raw, "input"))


def _is_token_id(value: object) -> bool:
    return type(value) is int  # not a bool, which JSON's true would be


def _token_row(row: object, where: str) -> list[int]:
    if not isinstance(row, list) or not row:
        raise invalid(f"{where} must be a non-empty list of token ids", "input")
    for j, token in enumerate(row):
        if not _is_token_id(token):
            raise invalid(f"{where}[{j}] must be a token id (an integer), got "
                          f"{type(token).__name__}: a row of token ids holds nothing else",
                          "input")
    return row


def embeddings_answer(name: str, result: Embeddings, packed: bool) -> dict[str, Any]:
    """OpenAI's list of embeddings; `packed`: each vector as base64 of its little-endian FP32
    bytes, as the SDK decodes it."""
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.tobytes()).decode() if packed else v}
            for i, v in enumerate(result.vectors)]
    return {"object": "list", "data": data, "model": name,
            "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens}}


def model_card(name: str, model: AnyModel) -> dict[str, Any]:
    """OpenAI's model object. `created`: when the model's folder last changed (a model
    prepared again is a new model); `root`: the model an alias calls."""
    try:
        created = int(model.config.path.stat().st_mtime)
    except OSError:  # the folder went away after the model loaded: it still serves
        created = 0
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER,
            "root": model.name}
