"""The OpenAI routes as the `openai` SDK sees them: a real server, the real `embed` model, the
real SDK (and httpx for Infinity's unprefixed routes and the raw error bodies)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from queryserve.pipelines.base import open_tokenizer
from tests.conftest import (
    REPOSITORY,
    RunningServer,
    start_server,
    stop_server,
    write_fake_model,
)

QUERIES = ["wake me up at five am this week", "play some jazz", "olly what's the weather"]
MAX_SEQUENCE_LENGTH = 256  # embed's model.yaml
SLASHED = "BAAI/bge-small-en-v1.5"
ALIAS = "text-embedding-3-small"


def sdk(server: RunningServer, api_key: str = "x") -> openai.OpenAI:
    # No retries: a 503 must reach the test as the server sent it.
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)


def kserve_vectors(server: RunningServer, texts: list[str]) -> np.ndarray:
    response = httpx.post(f"{server.url}/v2/models/embed/infer", timeout=30, json={"inputs": [
        {"name": "text", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}]})
    output = response.json()["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.asarray([d.embedding for d in response.data], dtype=np.float32)


@pytest.fixture(scope="module")
def alias_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`embed` alone, also served as OpenAI's model name."""
    folder = tmp_path_factory.mktemp("alias")
    (folder / "repository").mkdir()
    (folder / "repository" / "embed").symlink_to(REPOSITORY / "embed")
    server = start_server(folder / "repository", folder / "server.log",
                          "--served-model-name", f"{ALIAS}=embed",
                          "--served-model-name", f"{SLASHED}=embed")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A fake model behind an API key, to be unloaded: the errors a real model rarely gives."""
    folder = tmp_path_factory.mktemp("fake")
    write_fake_model(folder / "repository", "fake")
    server = start_server(folder / "repository", folder / "server.log", "--api-key", "secret")
    yield server
    stop_server(server)


# -- embeddings -------------------------------------------------------------------------------


def test_float_and_base64_embeddings_equal_the_kserve_vectors(
        real_server: RunningServer) -> None:
    client = sdk(real_server)
    expected = kserve_vectors(real_server, QUERIES)
    floats = client.embeddings.create(model="embed", input=QUERIES, encoding_format="float")
    decoded = client.embeddings.create(model="embed", input=QUERIES)  # the SDK asks for base64
    assert floats.model == "embed" and floats.object == "list"
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(QUERIES) * 3
    np.testing.assert_allclose(vectors(floats), expected, atol=1e-6)
    np.testing.assert_allclose(vectors(decoded), expected, atol=1e-6)
    packed = client.embeddings.create(model="embed", input=QUERIES[0], encoding_format="base64")
    raw = np.frombuffer(base64.b64decode(packed.data[0].embedding), dtype="<f4")  # type: ignore[arg-type]
    np.testing.assert_allclose(raw, kserve_vectors(real_server, QUERIES[:1])[0], atol=1e-6)
    same_width = client.embeddings.create(model="embed", input="hi", dimensions=384)
    assert len(same_width.data[0].embedding) == 384


def test_token_ids_of_the_models_tokenizer_embed_as_the_text_does(
        real_server: RunningServer) -> None:
    tokenizer = open_tokenizer(REPOSITORY / "embed" / "tokenizer.json", MAX_SEQUENCE_LENGTH)
    ids = [tokenizer.encode(q).ids for q in QUERIES]
    client = sdk(real_server)
    rows = client.embeddings.create(model="embed", input=ids, encoding_format="float")
    np.testing.assert_allclose(vectors(rows), kserve_vectors(real_server, QUERIES), atol=1e-6)
    assert rows.usage.prompt_tokens == sum(len(i) for i in ids)
    one = client.embeddings.create(model="embed", input=ids[1], encoding_format="float")
    np.testing.assert_allclose(vectors(one)[0], kserve_vectors(real_server, QUERIES[1:2])[0],
                               atol=1e-6)


def test_token_ids_padded_by_the_client_s_tokenizer_embed_as_the_text_does(
        real_server: RunningServer) -> None:
    """The tokenizer.json beside the model, as a client opens it, pads every encoding to 128:
    its ids, read with the padding as text, gave another vector (cosine 0.24)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(REPOSITORY / "embed" / "tokenizer.json"))
    tokenizer.enable_padding(length=128)  # as some exports ship it (this one did)
    ids = [tokenizer.encode(q).ids for q in QUERIES]
    assert all(len(row) == 128 and row[-1] == 0 for row in ids)
    rows = sdk(real_server).embeddings.create(model="embed", input=ids, encoding_format="float")
    np.testing.assert_allclose(vectors(rows), kserve_vectors(real_server, QUERIES), atol=1e-6)
    padding = httpx.post(f"{real_server.url}/v1/embeddings",
                         json={"model": "embed", "input": [[0, 0, 0]]})
    assert padding.status_code == 400 and "only padding" in padding.json()["error"]["message"]


def test_token_ids_past_the_max_sequence_length_are_truncated_as_text_is(
        real_server: RunningServer) -> None:
    tokenizer = open_tokenizer(REPOSITORY / "embed" / "tokenizer.json", MAX_SEQUENCE_LENGTH)
    text = "jazz " * 400
    ids = tokenizer.encode(text).ids[:-1] * 3  # 765 ids, no [SEP] where truncation cuts
    client = sdk(real_server)
    answer = client.embeddings.create(model="embed", input=ids, encoding_format="float")
    assert answer.usage.prompt_tokens == MAX_SEQUENCE_LENGTH
    first = client.embeddings.create(model="embed", input=ids[:MAX_SEQUENCE_LENGTH],
                                     encoding_format="float")
    np.testing.assert_allclose(vectors(answer), vectors(first), atol=1e-6)
    # A text's own ids, [SEP] last, are cut as the text is: the [SEP] stays (cos 0.9956 when
    # it was cut off with the rest).
    whole = open_tokenizer(REPOSITORY / "embed" / "tokenizer.json", 10_000).encode(text).ids
    as_ids = client.embeddings.create(model="embed", input=whole, encoding_format="float")
    as_text = client.embeddings.create(model="embed", input=text, encoding_format="float")
    np.testing.assert_allclose(vectors(as_ids), vectors(as_text), atol=1e-5)


@pytest.mark.parametrize(("body_input", "words"), [
    ([101, 30522, 102], "token id 30522"),
    ([[101, 102], [101, -5, 102]], "token id -5"),
    ([], "'input' is empty"),
    ([[]], "input[0] must be a non-empty list of token ids"),
    ([101, "jazz"], "input[1] must be a token id"),
    ([[101, 102], "jazz"], "input[1] must be a non-empty list of token ids"),
    (["jazz", [101]], "input[1] must be a string"),
    ([[101, True]], "input[0][1] must be a token id"),
    ([1.5], "input[0] must be a string"),
    ({"text": "jazz"}, "'input' must be a string, a list of strings, or token ids"),
    (["jazz", " "], "input[1] is empty"),
])
def test_bad_input_is_a_400_naming_the_item(real_server: RunningServer, body_input: object,
                                            words: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(real_server).embeddings.create(model="embed", input=body_input)  # type: ignore[arg-type]
    error = caught.value
    assert error.status_code == 400 and error.type == "invalid_request_error"
    assert error.param == "input" and words in error.message, error.message


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"encoding_format": "int8"}, "encoding_format", "use 'float' or 'base64'"),
    ({"dimensions": 8}, "dimensions", "returns 384 dimensions"),
    ({"dimensions": "384"}, "dimensions", "'dimensions' must be an integer, got \"384\""),
    ({"model": "intent"}, "model", "serves text_embedding models only"),
    ({"model": 7}, "model", "'model' must name a model"),
])
def test_bad_fields_are_400s_whose_param_names_the_field(
        real_server: RunningServer, extra: dict[str, object], param: str, words: str) -> None:
    body = {"model": "embed", "input": "jazz", **extra}
    response = httpx.post(f"{real_server.url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"] and error["code"] is None


def test_null_encoding_format_is_float_and_head_is_allowed_where_get_is(
        real_server: RunningServer) -> None:
    """`"encoding_format": null` is OpenAI's default, as `dimensions: null` already was (it
    was a 400 naming 'None'); a 405's Allow names HEAD, which GET routes answer."""
    body = {"model": "embed", "input": "jazz", "encoding_format": None}
    answer = httpx.post(f"{real_server.url}/v1/embeddings", json=body, timeout=30)
    assert answer.status_code == 200 and len(answer.json()["data"][0]["embedding"]) == 384
    refused = httpx.post(f"{real_server.url}/v1/models", timeout=30)
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"


def test_an_unknown_model_is_model_not_found(real_server: RunningServer) -> None:
    client = sdk(real_server)
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="gpt-4", input="jazz")
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    assert "unknown model 'gpt-4'" in caught.value.message
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4")
    assert caught.value.code == "model_not_found"


def test_too_many_items_is_a_413_in_openais_shape(real_server: RunningServer) -> None:
    response = httpx.post(f"{real_server.url}/v1/embeddings", timeout=30,
                          json={"model": "embed", "input": [[101, 102]] * 1025})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "at most 1024" in response.json()["error"]["message"]


def test_a_compressed_body_is_a_415_not_misread_json(real_server: RunningServer) -> None:
    import gzip

    body = gzip.compress(b'{"model": "embed", "input": "play some jazz"}')
    for path in ("/v1/embeddings", "/v1/spell", "/v2/models/embed/infer"):
        answer = httpx.post(f"{real_server.url}{path}", content=body,
                            headers={"content-encoding": "gzip"})
        assert answer.status_code == 415, (path, answer.text)
        assert "compressed request bodies are not supported" in answer.text


def test_what_the_transport_refuses_is_worded_as_the_route_words_errors(
        real_server: RunningServer) -> None:
    """A body over the limit is refused by the transport before the application sees it: it
    came as `{"error": "..."}` with no request id, which the OpenAI SDK reads as an error with
    no type."""
    big = {"model": "embed", "input": ["x" * 1000] * 9000}  # 9 MB
    client = sdk(real_server)
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(**big)
    assert refused.value.status_code == 413
    assert refused.value.type == "invalid_request_error"
    assert "over the limit" in refused.value.message
    assert refused.value.response.headers["x-request-id"]
    kserve = httpx.post(f"{real_server.url}/v2/models/embed/infer", json=big)
    assert kserve.status_code == 413 and "over the limit" in kserve.json()["error"]
    assert kserve.headers["x-request-id"]


def test_kserve_routes_keep_their_error_shape(real_server: RunningServer) -> None:
    response = httpx.post(f"{real_server.url}/v2/models/nope/infer", json={}, timeout=30)
    assert response.status_code == 404 and isinstance(response.json()["error"], str)


# -- models -----------------------------------------------------------------------------------


def test_models_list_and_retrieve(real_server: RunningServer) -> None:
    client = sdk(real_server)
    listed = {m.id: m for m in client.models.list()}
    assert {"embed", "duplicates", "intent"} <= set(listed)
    embed = client.models.retrieve("embed")
    assert embed == listed["embed"]
    assert embed.object == "model" and embed.owned_by == "queryserve" and embed.created > 0


# -- Infinity's unprefixed routes -------------------------------------------------------------


def test_embeddings_and_models_without_the_v1_prefix(real_server: RunningServer) -> None:
    with httpx.Client(base_url=real_server.url, timeout=30) as client:
        prefixed = client.post("/v1/embeddings", json={"model": "embed", "input": QUERIES})
        bare = client.post("/embeddings", json={"model": "embed", "input": QUERIES})
        assert bare.status_code == 200
        np.testing.assert_allclose([d["embedding"] for d in bare.json()["data"]],
                                   [d["embedding"] for d in prefixed.json()["data"]], atol=1e-6)
        assert client.get("/models").json() == client.get("/v1/models").json()
        assert client.get("/models/embed").json()["id"] == "embed"
        missing = client.post("/embeddings", json={"model": "nope", "input": "jazz"})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"


# -- served model names -----------------------------------------------------------------------


def test_an_alias_serves_its_model_under_openais_name(alias_server: RunningServer) -> None:
    client = sdk(alias_server)
    answer = client.embeddings.create(model=ALIAS, input=QUERIES, encoding_format="float")
    assert answer.model == ALIAS
    np.testing.assert_allclose(vectors(answer), kserve_vectors(alias_server, QUERIES),
                               atol=1e-6)
    assert [m.id for m in client.models.list()] == [SLASHED, "embed", ALIAS]
    alias = client.models.retrieve(ALIAS)
    assert alias.id == ALIAS and alias.owned_by == "queryserve"
    assert alias.model_dump()["root"] == "embed"
    # The SDK sends the slash as %2F (the transport keeps a path's %2F): it was a 404.
    assert client.models.retrieve(SLASHED).id == SLASHED
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="text-embedding-3-large", input="jazz")
    assert ALIAS in caught.value.message  # the names it does serve, aliases included


# -- errors other front ends share: keys, overload --------------------------------------------


def test_a_wrong_key_is_an_authentication_error(fake_server: RunningServer) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        sdk(fake_server, api_key="wrong").models.list()
    assert caught.value.status_code == 401
    assert caught.value.type == "authentication_error"
    assert caught.value.code == "invalid_api_key"
    assert [m.id for m in sdk(fake_server, api_key="secret").models.list()] == ["fake"]


def test_an_unloaded_model_is_a_503_with_retry_after(fake_server: RunningServer) -> None:
    headers = {"authorization": "Bearer secret"}
    client = sdk(fake_server, api_key="secret")
    assert len(client.embeddings.create(model="fake", input="jazz").data[0].embedding) == 16
    httpx.post(f"{fake_server.url}/v2/repository/models/fake/unload", headers=headers,
               timeout=30).raise_for_status()
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            client.embeddings.create(model="fake", input="jazz")
        error = caught.value
        assert error.status_code == 503 and error.type == "server_error"
        assert error.response.headers["retry-after"] == "1"
        assert "not loaded" in error.message
        # Not listed, so not found: retrieving it was a 503 the SDK retried for 2 s.
        assert client.models.list().data == []
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("fake")
        assert missing.value.code == "model_not_found" and "not loaded" in missing.value.message
    finally:
        httpx.post(f"{fake_server.url}/v2/repository/models/fake/load", headers=headers,
                   timeout=60).raise_for_status()


def test_an_unknown_id_with_slashes_is_model_not_found(real_server: RunningServer) -> None:
    """Model ids may hold slashes (`BAAI/bge-small-en-v1.5`): a path under `/v1/models/` is
    a model id, and an unknown one is a 404 the SDK reads, never a 400 about the name."""
    response = httpx.get(f"{real_server.url}/v1/models/BAAI/bge-small-en-v1.5", timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
