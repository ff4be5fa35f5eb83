"""The web pages (`/` and `/dashboard`) when things go wrong: a server that is down, hung or
restarted, a model unloaded, requests refused. Each test is a defect found by walking the pages
in a real browser (Playwright driving Debian's chromium, as tests/e2e/test_search.py does),
against a real server on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import (
    REPOSITORY,
    RunningServer,
    start_server,
    stop_server,
    write_fake_model,
)
from tests.e2e.test_search import CHROMIUM, wait_until

STALE = "document.querySelector('table').classList.contains('stale')"
ERROR = "document.getElementById('error').textContent !== ''"
TEN = "document.querySelectorAll('#results li').length === 10"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium (as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def search_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The default repository, as `make run` serves it: this module's own, as its tests unload
    models (and load them again)."""
    server = start_server(REPOSITORY, tmp_path_factory.mktemp("pages") / "server.log")
    yield server
    stop_server(server)


def test_regression_dashboard_marks_its_figures_stale_when_the_server_stops_answering(
        tmp_path: Path, browser: Any) -> None:
    """The dashboard showed its last figures as live while the server was hung or down, and
    started a /metrics fetch every second with no timeout: 20 were in flight after 20 s."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log")
    page = browser.new_page()
    in_flight: list[Any] = []
    most = [0]

    def started(request: Any) -> None:
        if request.url.endswith("/metrics"):
            in_flight.append(request)
            most[0] = max(most[0], len(in_flight))

    def ended(request: Any) -> None:
        if request in in_flight:
            in_flight.remove(request)

    page.on("request", started)
    page.on("requestfinished", ended)
    page.on("requestfailed", ended)
    try:
        page.goto(f"{server.url}/dashboard")
        page.locator("tr[data-model='fast']").wait_for(timeout=15_000)
        assert page.locator("#status").inner_text() == ""
        os.kill(server.process.pid, signal.SIGSTOP)  # hung: connections open, no answers
        try:
            wait_until(page, STALE, timeout=10_000)
            status = page.locator("#status").inner_text()
            assert status.startswith("Server not answering since "), status
            assert "no answer within 4 s" in status
            page.wait_for_timeout(3_000)
            assert most[0] == 1  # one scrape at a time, hung or not
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        wait_until(page, f"!{STALE}", timeout=15_000)  # back by itself
        assert page.locator("#status").inner_text() == ""
        stop_server(server)  # down: connections refused
        wait_until(page, STALE, timeout=10_000)
        assert "cannot connect" in page.locator("#status").inner_text()
        assert page.locator("tr[data-model='fast']").count() == 1  # the last figures, marked
    finally:
        page.close()
        if server.process.poll() is None:
            stop_server(server)


def test_regression_search_page_clears_old_results_when_the_server_hangs_or_is_down(
        tmp_path: Path, browser: Any) -> None:
    """With the server hung, the box said `hello adele` over the results of `shake it off`,
    with no error and no sign of a search running, for as long as the server was stuck; down,
    the page said `Failed to fetch` above them. Now the old results are dimmed while a search
    runs, cleared when it fails, and the search is tried again until the server answers."""
    server = start_server(REPOSITORY, tmp_path / "server.log")
    page = browser.new_page()
    results = page.locator("#results li")
    try:
        page.goto(f"{server.url}/")
        page.locator("#q").fill("shake it off")
        wait_until(page, TEN, timeout=15_000)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            page.locator("#q").fill("hello adele")
            wait_until(
                page, "document.getElementById('meta').textContent === 'Searching…'", timeout=3_000)
            assert page.locator("#results.stale").count() == 1
            wait_until(page, ERROR, timeout=15_000)
            assert page.locator("#error").inner_text().startswith(
                "The search server is not answering")
            assert results.count() == 0 and page.locator("#meta").inner_text() == ""
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        # Tried again by itself once the server answers: no keystroke needed.
        wait_until(page, TEN, timeout=20_000)
        assert page.locator("#error").inner_text() == ""
        assert "Adele" in page.locator("#results").inner_text()
        stop_server(server)
        page.locator("#q").fill("love story")
        wait_until(page, ERROR, timeout=15_000)
        assert page.locator("#error").inner_text().startswith("Can't reach the search server.")
        assert results.count() == 0 and page.locator("#timings").inner_text() == ""
    finally:
        page.close()
        if server.process.poll() is None:
            stop_server(server)


def test_regression_dashboard_never_shows_a_negative_rate_after_a_model_is_reloaded(
        tmp_path: Path, browser: Any) -> None:
    """After `POST .../intent/unload` the intent row showed -24.4 ... -28.1 requests/s for 5 s
    (and a restart did the same): a counter that went down was taken as requests that went."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log")
    page = browser.new_page()
    rate = "tr[data-model='fast'] .rate"
    try:
        page.goto(f"{server.url}/dashboard")
        page.locator(rate).wait_for(timeout=15_000)
        with httpx.Client() as client:
            for i in range(40):
                client.post(f"{server.url}/v1/embeddings",
                            json={"model": "fast", "input": f"query {i}"})
        wait_until(page, f"Number(document.querySelector(\"{rate}\").textContent) > 0",
                         timeout=10_000)
        assert httpx.post(f"{server.url}/v2/repository/models/fast/unload").status_code == 200
        assert httpx.post(f"{server.url}/v2/repository/models/fast/load",
                          timeout=60).status_code == 200
        shown = []
        for _ in range(24):  # the 5 s window, and more, after the reset
            page.wait_for_timeout(250)
            shown.append(float(page.locator(rate).inner_text()))
        assert min(shown) >= 0, shown
    finally:
        page.close()
        stop_server(server)


def test_regression_a_wrong_api_key_is_said_on_the_page_and_never_asked_for_in_a_loop(
        tmp_path: Path, browser: Any) -> None:
    """With a wrong key the dashboard opened 20 prompt() dialogs in 6 s (each tick asked up to
    3 times); after a Cancel the dashboard stayed empty without a word, the search page said
    `send 'Authorization: Bearer KEY'` and neither asked again until a reload; the key was
    typed in clear text. Now a refusal shows one small form, with a password field, and says
    on the page that the key is needed or wrong; nothing asks or retries until a key is given."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log", "--api-key", "s3cret")
    page = browser.new_page()
    dialogs: list[str] = []

    def answer(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept("wrong")

    scrapes: list[str] = []
    page.on("dialog", answer)
    page.on("request", lambda r: scrapes.append(r.url) if r.url.endswith("/metrics") else None)
    form, key = page.locator("#api-key"), page.locator("#api-key input[type=password]")
    try:
        page.goto(f"{server.url}/dashboard")
        form.wait_for(timeout=5_000)
        assert page.locator("#status").inner_text() == \
            "This server needs an API key: enter it above."
        key.fill("wrong")
        key.press("Enter")
        wait_until(page, "document.getElementById('status').textContent.includes('refused')",
                   timeout=5_000)
        assert form.inner_text().startswith("The server refused this API key.")
        refused = len(scrapes)
        page.wait_for_timeout(3_000)
        assert len(scrapes) == refused and dialogs == []  # no scrape, no dialog, until asked
        key.fill("s3cret")
        key.press("Enter")
        page.locator("tr[data-model='fast']").wait_for(timeout=10_000)
        assert form.is_hidden() and page.locator("#status").inner_text() == ""

        page.goto(f"{server.url}/")
        page.evaluate("sessionStorage.setItem('queryserve-api-key', 'rotated')")
        page.locator("#q").fill("jazz")
        wait_until(page, ERROR, timeout=10_000)
        assert page.locator("#error").inner_text() == \
            "The server refused the API key: enter the right one above."
        key.fill("s3cret")
        key.press("Enter")  # searched again with it (this repository has no `search`)
        wait_until(
            page, "document.getElementById('error').textContent.includes('search')", timeout=10_000)
        assert "API key" not in page.locator("#error").inner_text() and dialogs == []
    finally:
        page.close()
        stop_server(server)


def test_regression_dashboard_shows_failing_requests_and_a_model_not_ready(
        tmp_path: Path, browser: Any) -> None:
    """60 requests to `search` answered 400 and its row stayed at 0.0 requests/s and nothing
    else; an unloaded model showed 0.0 requests/s, as an idle healthy one does: only successes
    were counted, and `queryserve_model_ready` was not read."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log")
    page = browser.new_page()
    row = page.locator("tr[data-model='fast']")
    try:
        page.goto(f"{server.url}/dashboard")
        row.wait_for(timeout=15_000)
        assert row.locator(".state").inner_text() == "ready"
        with httpx.Client() as client:
            for _ in range(30):  # each refused 400: outcome="invalid"
                assert client.post(f"{server.url}/v1/embeddings",
                                   json={"model": "fast", "input": 123}).status_code == 400
        wait_until(page, "Number(document.querySelector(\"tr[data-model='fast'] .errors\")"
                         ".textContent) > 0", timeout=10_000)
        assert row.locator(".errors.failing").count() == 1
        assert row.locator(".rate").inner_text() == "0.0"
        assert httpx.post(f"{server.url}/v2/repository/models/fast/unload").status_code == 200
        page.locator("tr.not-ready[data-model='fast']").wait_for(timeout=10_000)
        assert row.locator(".state").inner_text() == "not ready"
    finally:
        page.close()
        stop_server(server)


def test_regression_search_page_says_what_failed_in_words(
        search_server: RunningServer, browser: Any) -> None:
    """The error line showed `Failed to fetch`, `Unexpected token '<', "<html><bod"... is not
    valid JSON` (a proxy's 502), `Unexpected end of JSON input` (a 429 with no body),
    `[object Object]` (`{"error": {"message": ...}}`), `body.results is not iterable`, and a
    503's instructions for the operator (`load it through the repository API ...`)."""
    page = browser.new_page()
    answers = {
        "proxy": (502, "text/html", "<html><body>Bad Gateway</body></html>"),
        "busy": (429, "text/plain", ""),
        "shape": (400, "application/json", '{"error": {"message": "query too odd."}}'),
        "null": (200, "application/json", '{"results": null}'),
    }

    def fulfil(route: Any) -> None:
        status, kind, body = answers[route.request.post_data_json["query"]]
        route.fulfill(status=status, content_type=kind, body=body)

    try:
        page.goto(f"{search_server.url}/")
        page.route("**/v1/search", fulfil)
        for query, said in [
                ("proxy", "No answer from the search server (HTTP 502). Trying again in 5 s."),
                ("busy", "Too many searches at the moment (HTTP 429). Trying again in 5 s."),
                ("shape", "The server refused this search: query too odd."),
                ("null", "The server's answer could not be read.")]:
            page.locator("#q").fill(query)
            wait_until(page, "said => document.getElementById('error').textContent"
                             ".startsWith(said)", arg=said, timeout=10_000)
            assert page.locator("#results li").count() == 0
        page.unroute("**/v1/search")
        page.locator("#q").fill("shake it off")
        wait_until(page, TEN, timeout=15_000)
        url = search_server.url
        assert httpx.post(f"{url}/v2/repository/models/embed/unload").status_code == 200
        try:
            page.locator("#q").fill("hello adele")
            wait_until(page, ERROR, timeout=10_000)
            assert page.locator("#error").inner_text().startswith(
                "Search is unavailable for the moment (HTTP 503).")
            assert page.locator("#results li").count() == 0
        finally:
            assert httpx.post(f"{url}/v2/repository/models/embed/load",
                              timeout=120).status_code == 200
        wait_until(page, TEN, timeout=15_000)  # tried again by itself
    finally:
        page.close()


def test_regression_search_page_says_which_steps_were_skipped(
        search_server: RunningServer, browser: Any) -> None:
    """With `spell` unloaded the answer said `"skipped": ["spell"]`, and the page searched
    `taylor swfit shak it off` as typed without a word: no correction, no note."""
    page = browser.new_page()
    url = search_server.url
    assert httpx.post(f"{url}/v2/repository/models/spell/unload").status_code == 200
    try:
        page.goto(f"{url}/")
        page.locator("#q").fill("taylor swfit shak it off")
        page.locator("#meta .skipped").wait_for(timeout=15_000)
        assert page.locator("#meta .skipped").inner_text() == \
            "Skipped for now: spell. No spelling correction: searched as typed."
        assert page.locator("#results li").count() == 10
    finally:
        page.close()
        assert httpx.post(f"{url}/v2/repository/models/spell/load",
                          timeout=120).status_code == 200


def test_regression_search_instead_for_holds_when_the_catalog_changes(
        search_server: RunningServer, browser: Any) -> None:
    """After "Search instead for taylor swfit", a switch to products (and back) brought back
    "Showing results for taylor swift": a change of catalog always searched with spelling."""
    page = browser.new_page()
    corrected = page.locator("#meta .corrected")
    try:
        page.goto(f"{search_server.url}/")
        page.locator("#q").fill("taylor swfit")
        corrected.wait_for(timeout=15_000)
        page.locator("#meta a.typed").click()
        corrected.wait_for(state="detached", timeout=15_000)
        for name in ("products", "songs"):
            page.locator("#catalog").select_option(name)
            page.wait_for_timeout(1_000)
            assert corrected.count() == 0 and page.locator("#results li").count() > 0
        page.locator("#q").fill("taylor swfit shak it off")  # typing: corrected again
        corrected.wait_for(timeout=15_000)
    finally:
        page.close()


def contrast(page: Any, selector: str, background: str) -> float:
    """WCAG's contrast ratio of an element's text colour on the colour of `background`."""
    def luminance(css: str) -> float:
        channels = [int(x) / 255 for x in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
        r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
                   for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    text = luminance(page.locator(selector).first.evaluate("e => getComputedStyle(e).color"))
    behind = luminance(page.locator(background).first.evaluate(
        "e => getComputedStyle(e).backgroundColor"))
    return (max(text, behind) + 0.05) / (min(text, behind) + 0.05)


def test_regression_pages_name_their_controls_announce_answers_and_have_contrast(
        search_server: RunningServer, browser: Any) -> None:
    """The search box and the catalog had no accessible name, nothing was announced to a screen
    reader, the score and the unsure intent were grey at 3.3:1 and 3.0:1, and the dashboard's
    table had no caption, no header scopes, and its charts no text."""
    page = browser.new_page()
    try:
        page.goto(f"{search_server.url}/")
        page.get_by_role("searchbox", name="Search").fill("taylor swfit shak it off")
        assert page.get_by_role("combobox", name="Catalog").count() == 1
        assert page.locator("#meta").get_attribute("role") == "status"
        assert page.locator("#error").get_attribute("role") == "alert"
        page.locator("#meta .intent.unsure").wait_for(timeout=15_000)
        assert contrast(page, "li .score", "li") >= 4.5
        assert contrast(page, ".chip.unsure", ".chip.unsure") >= 4.5
        page.goto(f"{search_server.url}/dashboard")
        page.locator("tr[data-model='embed']").wait_for(timeout=15_000)
        assert page.locator("caption").inner_text()
        assert page.locator("th:not([scope=col])").count() == 0
        assert page.locator("tr[data-model='embed'] svg").get_attribute(
            "aria-label").startswith("requests/s over the last")
    finally:
        page.close()


def test_regression_pages_are_sent_with_security_headers_and_work_under_them(
        search_server: RunningServer, browser: Any) -> None:
    """The pages, which ask for the API key, were sent with no Content-Security-Policy and
    could be framed by any site; the dashboard put scraped model names into innerHTML (a
    crafted /metrics ran an `onerror`)."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    page.on("pageerror", lambda error: console.append(str(error)))
    try:
        for path in ("/", "/dashboard"):
            headers = httpx.get(f"{search_server.url}{path}").headers
            policy = headers["content-security-policy"]
            assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
            assert "unsafe-inline" not in policy and "'sha256-" in policy
            assert (headers["x-content-type-options"], headers["x-frame-options"],
                    headers["referrer-policy"], headers["cache-control"]) == (
                "nosniff", "DENY", "no-referrer", "no-cache")
        page.goto(f"{search_server.url}/")
        page.locator("#q").fill("taylor swfit shak it off")
        page.locator("#meta .corrected").wait_for(timeout=15_000)
        page.goto(f"{search_server.url}/dashboard")
        page.locator("tr[data-model='embed']").wait_for(timeout=15_000)
        name = "<img src=x onerror=window.pwned=1>"
        page.route("**/metrics", lambda route: route.fulfill(
            status=200, content_type="text/plain",
            body=f'queryserve_requests_total{{model="{name}",outcome="success"}} 1\n'))
        page.locator("#models td").filter(has_text=name).wait_for(timeout=5_000)
        assert page.evaluate("window.pwned") is None
        assert not [text for text in console if "Content Security Policy" in text], console
    finally:
        page.close()
