"""The web pages: the search bar (`/`) and the live dashboard (`/dashboard`), each one
self-contained HTML file read once at start (no build step), with the script that sends the
API key (`api_key.js`) written in where it says `/* api_key.js */`.

The pages are public (`PAGES` is on the key check's list of exceptions): they hold no data,
and a browser opening one cannot send a key; every request they make is checked.

Each is sent with a Content-Security-Policy that lets run only its own inline script and
style (named by their SHA-256, taken here from the page as served), fetch only from this
server, and be framed by no one (a page that asks for the API key must not be overlaid); the
browser is told not to sniff the type, send no referrer, and ask again before using a copy.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from queryserve.server.http import Request, Response
from queryserve.server.routing import Handler, Router
from queryserve.server.state import ServerState

STATIC = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/dashboard": "dashboard.html"}


def add_routes(router: Router, state: ServerState) -> None:
    key_script = (STATIC / "api_key.js").read_text(encoding="utf-8")
    for path, name in PAGES.items():
        html = (STATIC / name).read_text(encoding="utf-8").replace("/* api_key.js */", key_script)
        router.add("GET", path, _page(html.encode(), security_headers(html)))


def security_headers(html: str) -> list[tuple[str, str]]:
    policy = (f"default-src 'none'; script-src {_hashes(html, 'script')}; "
              f"style-src {_hashes(html, 'style')}; connect-src 'self'; img-src 'self' data:; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return [("content-security-policy", policy), ("x-content-type-options", "nosniff"),
            ("x-frame-options", "DENY"), ("referrer-policy", "no-referrer"),
            ("cache-control", "no-cache")]


def _hashes(html: str, tag: str) -> str:
    """The CSP sources that allow the page's inline `<tag>` elements, and nothing else."""
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                    for body in bodies) or "'none'"


def _page(body: bytes, headers: list[tuple[str, str]]) -> Handler:
    async def page(request: Request) -> Response:
        # A list of its own: the application appends the request id to each response's.
        return Response(200, body, "text/html; charset=utf-8", list(headers))

    return page
