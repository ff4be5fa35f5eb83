"""The search bar end to end: the vector index (built from real catalog rows with the real
encoder, ANN against exact search, rebuilt when the encoder changes), `/v1/search` on the
default repository as `make run` serves it, and the web page and dashboard in a real browser
(Playwright driving Debian's chromium; screenshots are kept under test-artifacts/).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from queryserve.indexing import build_index
from queryserve.local import embed
from queryserve.pipelines.search.index import index_is_current, load_index
from tests.conftest import (
    REPOSITORY,
    ROOT,
    RunningServer,
    start_server,
    stop_server,
    write_fake_model,
)

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")


def wait_until(page: Any, predicate: str, timeout: float, arg: Any = None) -> None:
    """`page.wait_for_function`, for pages sent with a Content-Security-Policy: Playwright's
    polling evaluates the predicate as a string in the page (`eval`, which the policy
    refuses), where `page.evaluate` does not."""
    deadline = time.monotonic() + timeout / 1000  # in ms, as Playwright's
    while not page.evaluate(predicate, arg):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} ms: {predicate}")
        page.wait_for_timeout(100)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first rows of each catalog table, in the repository's data layout."""
    folder = tmp_path_factory.mktemp("catalog")
    for path in [ROOT / "data/billboard-hot100/hot100_songs_1997_2026.csv",
                 *sorted((ROOT / "data/product-matching").glob("*/tables/*.csv"))]:
        target = folder / path.relative_to(ROOT / "data")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(path.read_text(encoding="utf-8").splitlines()[:120]) + "\n",
                          encoding="utf-8")
    return folder


def test_index_is_built_searched_and_rebuilt_when_the_encoder_or_graph_changes(
        data: Path, tmp_path: Path) -> None:
    encoder = REPOSITORY / "embed"
    built = build_index(tmp_path / "index", encoder, data, progress=False)
    assert built["songs"] == 119 and built["products"] == 6 * 119
    assert index_is_current(tmp_path / "index", encoder)
    songs = load_index(tmp_path / "index", "songs")
    assert np.allclose(np.linalg.norm(songs.vectors, axis=1), 1.0, atol=1e-4)
    # The item's own text finds the item, by ANN and by exact search alike.
    queries = embed(encoder, [item.text for item in songs.items[:20]])
    exact = songs.exact(queries, 5)
    assert (exact[:, 0] == np.arange(20)).all()
    assert (songs.search_many(queries, 5)[:, 0] == exact[:, 0]).all()
    first = songs.search(queries[0], 3)
    # Not exactly 1: the int8 encoder quantizes activations per batch, so a text's vector
    # moves a little with the batch it was embedded in.
    assert first[0][0] == songs.items[0] and first[0][1] == pytest.approx(1.0, abs=0.02)
    # Another encoder's vectors are not comparable, and another graph has another recall:
    # either way the index is no longer current.
    meta = tmp_path / "index" / "songs" / "meta.json"
    built_meta = json.loads(meta.read_text())
    meta.write_text(json.dumps({**built_meta, "encoder": "another"}))
    assert not index_is_current(tmp_path / "index", encoder)
    meta.write_text(json.dumps({**built_meta, "hnsw": {"M": 16, "efConstruction": 40}}))
    assert not index_is_current(tmp_path / "index", encoder)
    meta.write_text(json.dumps(built_meta))
    assert index_is_current(tmp_path / "index", encoder)


def requests_of(server: RunningServer, model: str) -> float:
    line = f'queryserve_requests_total{{model="{model}",outcome="success"}} '
    found = [float(x.rsplit(" ", 1)[1]) for x in httpx.get(f"{server.url}/metrics").text.split(
        "\n") if x.startswith(line)]
    return found[0] if found else 0.0


def test_search_corrects_embeds_and_finds_the_song(real_server: RunningServer) -> None:
    before = {m: requests_of(real_server, m) for m in ("spell", "embed", "intent")}
    answer = httpx.post(f"{real_server.url}/v1/search", timeout=30,
                        json={"query": "taylor swfit shak it off", "k": 10})
    assert answer.status_code == 200, answer.text
    # Each step counts a request on its own model, as Triton counts an ensemble's steps (the
    # dashboard and `bench`'s server figures read these).
    assert {m: requests_of(real_server, m) - before[m] for m in before} == {
        "spell": 1, "embed": 1, "intent": 1}
    body = answer.json()
    assert body["corrected"] == "taylor swift shake it off" and body["changed"]
    assert body["searched"] == body["corrected"]  # a sure correction is searched
    # Intent comes from the intent model alongside (MASSIVE's labels, not a music catalog's).
    assert isinstance(body["intent"]["intent"], str) and 0 < body["intent"]["score"] <= 1
    top = body["results"][0]
    assert (top["title"], top["performer_or_brand"]) == ("Shake It Off", "Taylor Swift")
    assert len(body["results"]) == 10
    scores = [r["score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert set(body["timings_ms"]) == {"spell", "embed", "ann", "intent", "total"}
    # An unsure correction (the spell score under pipeline.yaml's min_score) is only offered:
    # the query is searched as typed.
    unsure = httpx.post(f"{real_server.url}/v1/search", json={"query": "wasted temas"}).json()
    assert unsure["changed"] and unsure["spell_score"] < 0.5
    assert unsure["searched"] == "wasted temas" != unsure["corrected"]
    typed = httpx.post(f"{real_server.url}/v1/search", json={"query": "taylor swfit",
                                                             "spell": False}).json()
    assert typed["spell_score"] is None and typed["searched"] == "taylor swfit"  # not 1.0
    products = httpx.post(f"{real_server.url}/v1/search", timeout=30,
                          json={"query": "sony turntable", "catalog": "products", "k": 3})
    assert products.status_code == 200
    assert any("sony" in (r["title"] + r["performer_or_brand"]).lower()
               for r in products.json()["results"])
    for body_, words in [({"query": ""}, '"query": a non-empty string'),
                         ({"query": "\u0000"}, '"query": a non-empty string'),  # was searched
                         ({"query": "\u200b"}, '"query": a non-empty string'),
                         ({"query": "jazz", "k": 0}, "'k' must be an integer"),
                         ({"query": "jazz", "catalog": "movies"}, "'catalog' is \"movies\"")]:
        bad = httpx.post(f"{real_server.url}/v1/search", json=body_)
        assert bad.status_code == 400 and words in bad.json()["error"], bad.text


def test_a_correction_to_another_catalogs_word_is_only_offered(
        real_server: RunningServer) -> None:
    # One corrector serves both catalogs, and its language model learned both: "levi's jeans"
    # is corrected to the song "Levii's Jeans", sure (0.9999). In the songs it is searched; in
    # the products, where no item says "levii's", it is only offered.
    def search(query: str, catalog: str) -> dict[str, Any]:
        answer = httpx.post(f"{real_server.url}/v1/search", timeout=30,
                            json={"query": query, "catalog": catalog, "k": 3})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    songs, products = search("levi's jeans", "songs"), search("levi's jeans", "products")
    for body in (songs, products):
        assert body["corrected"] == "levii's jeans" and body["spell_score"] >= 0.5
    assert songs["searched"] == "levii's jeans" and products["searched"] == "levi's jeans"
    assert songs["results"][0]["title"] == "Levii's Jeans"
    # A correction to words the products use is searched there ("usb-c" is no typo at all).
    assert search("samsng tv", "products")["searched"] == "samsung tv"
    assert search("usb-c cable", "products")["searched"] == "usb-c cable"


def test_search_is_a_kserve_ensemble_model(real_server: RunningServer) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(real_server.host_port)
    assert client.is_model_ready("search")
    metadata = client.get_model_metadata("search")
    assert metadata["platform"] == "ensemble"
    assert [o["name"] for o in metadata["outputs"]] == [
        "corrected", "intent", "results", "searched", "spell_score", "intent_score",
        "intent_confident", "skipped"]
    steps = client.get_model_config("search")["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["spell", "embed", "intent"]
    queries = ["taylor swfit shak it off", "blank spase"]
    tensor = triton.InferInput("query", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[q.encode()] for q in queries], dtype=object))
    before = client.get_inference_statistics("search")["model_stats"][0]
    result = client.infer("search", [tensor])
    # As Triton counts an ensemble's request: one execution of its batch size, its queries
    # inferences, and one queue and compute entry (the steps count theirs on their models).
    after = client.get_inference_statistics("search")["model_stats"][0]
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["last_inference"] > 0
    for figure in ("success", "queue", "compute_infer"):
        assert (after["inference_stats"][figure]["count"]
                - before["inference_stats"][figure]["count"]) == 1, figure
    assert {b["batch_size"] for b in after["batch_stats"]} >= {2}
    corrected = [v.decode() for v in result.as_numpy("corrected").ravel()]
    assert corrected == ["taylor swift shake it off", "blank space"]
    for i, query in enumerate(queries):
        expected = httpx.post(f"{real_server.url}/v1/search", json={"query": query}).json()
        assert json.loads(result.as_numpy("results")[i, 0]) == expected["results"]
        # What a page needs to say "showing results for" or "did you mean", and whether to
        # assert the intent, as /v1/search says it (a KServe client had the correction only).
        assert result.as_numpy("searched")[i, 0].decode() == expected["searched"]
        assert result.as_numpy("spell_score")[i, 0] == pytest.approx(expected["spell_score"])
        assert result.as_numpy("intent_score")[i, 0] == pytest.approx(
            expected["intent"]["score"], abs=0.05)  # int8: its batch-mates move it a little
        assert result.as_numpy("skipped")[i, 0].decode() == ",".join(expected["skipped"])
    assert result.as_numpy("intent_confident").dtype == np.bool_
    missing = httpx.post(f"{real_server.url}/v2/models/search/infer",
                         json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                           "data": ["x"]}]})
    assert missing.status_code == 400 and "query" in missing.json()["error"]


def test_search_answers_without_an_optional_step_that_cannot(
        real_server: RunningServer) -> None:
    """Regression: search failed as a whole (503) when its intent step was overloaded. A step
    that cannot answer now (overloaded, or here unloaded) is skipped and named."""
    url = real_server.url
    query = {"query": "taylor swfit shak it off", "k": 3}
    assert httpx.post(f"{url}/v2/repository/models/intent/unload").status_code == 200
    try:
        answer = httpx.post(f"{url}/v1/search", json=query, timeout=30)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["intent"] is None and body["skipped"] == ["intent"]
        assert "intent" not in body["timings_ms"]
        assert body["corrected"] == "taylor swift shake it off"
        assert body["results"][0]["title"] == "Shake It Off"
        assert httpx.get(f"{url}/v2/models/search/ready").status_code == 400  # a step is out
    finally:
        assert httpx.post(f"{url}/v2/repository/models/intent/load",
                          timeout=120).status_code == 200
    again = httpx.post(f"{url}/v1/search", json=query, timeout=30).json()
    assert again["intent"] is not None and again["skipped"] == []


def test_pages_are_served_by_the_server_itself(real_server: RunningServer) -> None:
    page = httpx.get(f"{real_server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="q"' in page.text and "/v1/search" in page.text
    dashboard = httpx.get(f"{real_server.url}/dashboard")
    assert dashboard.status_code == 200 and "/metrics" in dashboard.text


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium (as root)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=["--no-sandbox"])
        yield browser
        browser.close()


def test_typing_a_misspelled_song_shows_the_correction_and_the_song(
        real_server: RunningServer, browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"{real_server.url}/")
    page.locator("#q").press_sequentially("taylor swfit shak it off", delay=20)
    page.locator("#meta .corrected").wait_for(timeout=15_000)
    assert page.locator("#meta .corrected").inner_text() == "taylor swift shake it off"
    first = page.locator("#results li").first
    assert "Shake It Off" in first.inner_text() and "Taylor Swift" in first.inner_text()
    assert "spell" in page.locator("#timings").inner_text()
    assert page.locator("#meta .intent").inner_text()  # the intent model's label, shown
    page.screenshot(path=str(ARTIFACTS / "search.png"), full_page=True)
    # "Search instead for" the query as typed: the same page, without the correction.
    page.locator("#meta a.typed").click()
    page.locator("#meta .corrected").wait_for(state="detached", timeout=15_000)
    assert "Shake It Off" in page.locator("#results").inner_text()
    page.close()


def test_dashboard_shows_throughput_after_a_burst(real_server: RunningServer,
                                                 browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"{real_server.url}/dashboard")
    page.locator("tr[data-model='embed']").wait_for(timeout=15_000)
    with httpx.Client() as client:
        for i in range(60):  # a bounded burst, on 127.0.0.1 only
            client.post(f"{real_server.url}/v1/embeddings",
                        json={"model": "embed", "input": f"burst query {i}"})
    wait_until(
        page, "Number(document.querySelector(\"tr[data-model='embed'] .rate\").textContent) > 0",
        timeout=15_000)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    page.close()


def test_the_pages_ask_for_the_api_key_and_use_it(tmp_path: Path, browser: object) -> None:
    """With `--api-key`, opening a page was a 401 (a browser sends no key when it navigates)
    and the pages' requests sent none: both pages were unusable. The HTML is public now; a
    refused request shows a form for the key (a password field), and every request of the tab
    carries the key given there."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log", "--api-key", "s3cret")
    try:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        page = browser.new_page()  # type: ignore[attr-defined]
        assert page.goto(f"{server.url}/dashboard").status == 200
        form = page.locator("#api-key")
        form.wait_for(timeout=15_000)
        assert form.inner_text().startswith("This server needs its API key (--api-key):")
        page.locator("#api-key input[type=password]").fill("s3cret")
        page.locator("#api-key input").press("Enter")
        page.locator("tr[data-model='fast']").wait_for(timeout=15_000)
        assert form.is_hidden()
        # The search page, in the same tab: the key is kept, not asked again; the request gets
        # past the key to the model (this repository has no `search`).
        assert page.goto(f"{server.url}/").status == 200
        page.locator("#q").press_sequentially("jazz", delay=20)
        wait_until(page, "document.getElementById('error').textContent.includes('search')",
                         timeout=15_000)
        assert "API key" not in page.locator("#error").inner_text()
        assert page.locator("#api-key").is_hidden()
        page.close()
    finally:
        stop_server(server)
