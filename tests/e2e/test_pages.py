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

import pytest

from tests.conftest import start_server, stop_server, write_fake_model
from tests.e2e.test_search import CHROMIUM

STALE = "document.querySelector('table').classList.contains('stale')"


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
            page.wait_for_function(STALE, timeout=10_000)
            status = page.locator("#status").inner_text()
            assert status.startswith("Server not answering since "), status
            assert "no answer within 4 s" in status
            page.wait_for_timeout(3_000)
            assert most[0] == 1  # one scrape at a time, hung or not
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        page.wait_for_function(f"!{STALE}", timeout=15_000)  # back by itself
        assert page.locator("#status").inner_text() == ""
        stop_server(server)  # down: connections refused
        page.wait_for_function(STALE, timeout=10_000)
        assert "cannot connect" in page.locator("#status").inner_text()
        assert page.locator("tr[data-model='fast']").count() == 1  # the last figures, marked
    finally:
        page.close()
        if server.process.poll() is None:
            stop_server(server)
