"""OpenAI's embeddings route, `POST /v1/embeddings`, over any `text_embedding` model: the
request's `model` names it, `input` is a string or a list of strings; `encoding_format` float
or base64; `dimensions` only as the model's own width."""

from __future__ import annotations

import base64

from queryserve.api import Embeddings, Inputs
from queryserve.errors import InvalidInput
from queryserve.server.http import Request, Response
from queryserve.server.routing import Router, ServerState, json_body, json_response

EXAMPLE = '{"model": "embed", "input": ["play some jazz"]}'


def add_routes(router: Router, state: ServerState) -> None:
    async def embeddings(request: Request) -> Response:
        body = json_body(request, EXAMPLE)
        name = body.get("model")
        if not isinstance(name, str):
            raise InvalidInput(f"'model' must name a model, e.g. {EXAMPLE}")
        model = state.repository.get(name).answering(Embeddings, "/v1/embeddings")
        raw = body.get("input")
        if isinstance(raw, str):
            raw = [raw]
        texts = state.texts(raw, "input")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InvalidInput(f"encoding_format {str(encoding)[:40]!r} is not supported; use "
                               "'float' or 'base64'")
        width = model.config.outputs[0].dims[-1]
        dimensions = body.get("dimensions")
        if dimensions not in (None, width) or isinstance(dimensions, bool):
            raise InvalidInput(f"model '{name}' returns {width} dimensions; 'dimensions' "
                               f"{str(dimensions)[:40]} is not supported")
        result = await model.infer(Inputs(texts))
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64"
                 else v}
                for i, v in enumerate(result.vectors)]
        return json_response({"object": "list", "data": data, "model": name,
                              "usage": {"prompt_tokens": result.tokens,
                                        "total_tokens": result.tokens}})

    router.add("POST", "/v1/embeddings", embeddings)
