"""The web pages: the search bar (`/`) and the live dashboard (`/dashboard`), each one
self-contained HTML file read once at start (no build step), with the script that sends the
API key (`api_key.js`) written in where it says `/* api_key.js */`.

The pages are public (`PAGES` is on the key check's list of exceptions): they hold no data,
and a browser opening one cannot send a key; every request they make is checked."""

from __future__ import annotations

from pathlib import Path

from queryserve.server.http import Request, Response
from queryserve.server.routing import Handler, Router
from queryserve.server.state import ServerState

STATIC = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/dashboard": "dashboard.html"}


def add_routes(router: Router, state: ServerState) -> None:
    key_script = (STATIC / "api_key.js").read_text(encoding="utf-8")
    for path, name in PAGES.items():
        html = (STATIC / name).read_text(encoding="utf-8")
        router.add("GET", path, _page(html.replace("/* api_key.js */", key_script).encode()))


def _page(body: bytes) -> Handler:
    async def page(request: Request) -> Response:
        return Response(200, body, "text/html; charset=utf-8")

    return page
