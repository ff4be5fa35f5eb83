"""The web pages: the search bar (`/`) and the live dashboard (`/dashboard`), each one
self-contained HTML file read once at start (no build step)."""

from __future__ import annotations

from pathlib import Path

from queryserve.server.http import Request, Response
from queryserve.server.routing import Handler, Router
from queryserve.server.state import ServerState

STATIC = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/dashboard": "dashboard.html"}


def add_routes(router: Router, state: ServerState) -> None:
    for path, name in PAGES.items():
        router.add("GET", path, _page((STATIC / name).read_bytes()))


def _page(body: bytes) -> Handler:
    async def page(request: Request) -> Response:
        return Response(200, body, "text/html; charset=utf-8")

    return page
