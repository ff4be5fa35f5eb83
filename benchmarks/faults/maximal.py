"""The largest valid request of each route (the most items a request may hold, each as long as
its model reads) sent among ordinary requests to the same route and to `/v1/search`. Targets:
the maximal request answered 200, and the ordinary requests beside it answered 200; their p99
is reported beside the p99 they had just before."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from tokenizers import Tokenizer

from faults.client import Background, Stream, post
from faults.common import REPOSITORY, Mode, Server, kserve_body, log, ms, queries, serving, verdict
from faults.records import Records, summarize

TITLE = "Maximal requests among ordinary ones"
MAX_ITEMS = 1024  # the server's default --max-items
MAX_WORDS = 64  # what `spell` corrects (parameters.max_words)
MAX_K = 100  # the most results /v1/search returns
RATE = 20.0  # req/s of ordinary requests, to the route and to /v1/search each
WARMUP_S, BEFORE_S, AFTER_S = 1.0, 3.0, 1.0  # a model's first requests of a shape are slow
SEARCH = "/v1/search"


def max_tokens(model: str) -> int:
    config = yaml.safe_load((REPOSITORY / model / "model.yaml").read_text())
    return int(config["parameters"]["max_sequence_length"])


def long_texts(model: str, count: int) -> list[str]:
    """`count` different texts of real queries strung together, each cut where `model`'s
    tokenizer reaches its max_sequence_length (the special tokens counted)."""
    tokenizer = Tokenizer.from_file(str(REPOSITORY / model / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    room = max_tokens(model) - tokenizer.num_special_tokens_to_add(False)
    texts, out = queries(), []
    for i in range(count):
        text = " ".join(texts[(i * 13 + j) % len(texts)] for j in range(room // 2))
        offsets = tokenizer.encode(text, add_special_tokens=False).offsets
        out.append(text[:offsets[min(room, len(offsets)) - 1][1]])
    return out


def long_queries(count: int) -> list[str]:
    """`count` different queries of MAX_WORDS words of real queries."""
    words = " ".join(queries()).split()
    return [" ".join(words[(i * 17 + j) % len(words)] for j in range(MAX_WORDS))
            for i in range(count)]


def dumps(value: object) -> bytes:
    return json.dumps(value).encode()


BODY_LIMIT = 8 * 1024 * 1024  # the server's default --max-body-bytes


def page(chars: int) -> str:
    """One text of `chars` characters of real queries: pasted pages, up to the body limit (a
    tokenizer reads a text whole before it truncates: such a text held every client 4-5 s,
    and a pair of them took tens of GB, until texts were cut before tokenizing)."""
    text = " ".join(queries())
    return (text * (chars // len(text) + 1))[:chars]


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    maximal: Callable[[int], bytes]  # the largest request of `n` items
    ordinary: Callable[[str], bytes]  # an ordinary one-query request
    single: bool = False  # one item, as large as the body limit allows


ROUTES = [
    Route("KServe v2 infer, `embed`", "/v2/models/embed/infer",
          lambda n: kserve_body(long_texts("embed", n)), lambda q: kserve_body([q])),
    Route("OpenAI embeddings, `embed`", "/v1/embeddings",
          lambda n: dumps({"model": "embed", "input": long_texts("embed", n)}),
          lambda q: dumps({"model": "embed", "input": [q]})),
    Route("`/v1/intent`", "/v1/intent",
          lambda n: dumps({"queries": long_texts("intent", n), "top_k": 3}),
          lambda q: dumps({"queries": [q], "top_k": 3})),
    Route("`/v1/duplicates`", "/v1/duplicates",
          lambda n: dumps({"pairs": [list(p) for p in zip(
              long_texts("duplicates", n), reversed(long_texts("duplicates", n)),
              strict=True)]}),
          lambda q: dumps({"pairs": [[q, q.upper()]]})),
    Route("`/v1/spell`, `spell`", "/v1/spell",
          lambda n: dumps({"queries": long_queries(n)}), lambda q: dumps({"queries": [q]})),
    Route("`/v1/spell`, `spell-seq2seq`", "/v1/spell",
          lambda n: dumps({"model": "spell-seq2seq", "queries": long_texts("spell-seq2seq", n)}),
          lambda q: dumps({"model": "spell-seq2seq", "queries": [q]})),
    Route("OpenAI embeddings, `embed`, one text of the body limit", "/v1/embeddings",
          lambda n: dumps({"model": "embed", "input": page(BODY_LIMIT - 1000)}),
          lambda q: dumps({"model": "embed", "input": [q]}), single=True),
    Route("`/v1/duplicates`, one pair of texts of half the body limit each", "/v1/duplicates",
          lambda n: dumps({"pairs": [[page(BODY_LIMIT // 2 - 1000)] * 2]}),
          lambda q: dumps({"pairs": [[q, q.upper()]]}), single=True),
    Route("`/v1/search`, k 100", SEARCH,
          lambda n: dumps({"query": long_queries(1)[0], "k": MAX_K, "catalog": "songs"}),
          lambda q: dumps({"query": q})),
]


def one_route(server: Server, route: Route, items: int) -> dict[str, Any]:
    texts = queries(500)
    body = route.maximal(items)
    streams = [Stream(route.path, [route.ordinary(q) for q in texts], RATE)]
    if route.path != SEARCH:
        streams.append(Stream(SEARCH, [dumps({"query": q}) for q in texts], RATE))
    log(f"maximal: {route.name}, {len(body) / 1e6:.1f} MB")
    with Background(server.url, *streams, max_s=1800, drain_s=10) as load:
        time.sleep(WARMUP_S)
        warm = time.monotonic()
        time.sleep(BEFORE_S)
        sent = time.monotonic()
        status, seconds, size = post(server.url + route.path, body, timeout_s=900)
        answered = time.monotonic()
        time.sleep(AFTER_S)
        records: list[Records] = load.stop()
    return {
        "route": route.name, "path": route.path,
        "items": 1 if route.single or route.path == SEARCH else items,
        "request_mb": len(body) / 1e6, "status": status, "seconds": seconds,
        "answer_mb": size / 1e6,
        "others": [{"path": s.path, "before": summarize(r, warm, sent, by="done"),
                    "during": summarize(r, sent, answered, by="in flight")}
                   for s, r in zip(streams, records, strict=True)],
    }


def measure(mode: Mode) -> dict[str, Any]:
    items = mode.pick(MAX_ITEMS, 32)
    with serving(REPOSITORY, "maximal") as server:
        rows = [one_route(server, route, items) for route in ROUTES]
    failed = [r["route"] for r in rows if r["status"] != 200]
    errors = sum(o["during"]["non_200"] for r in rows for o in r["others"])
    during = sum(o["during"]["requests"] for r in rows for o in r["others"])
    worst = max((o["during"]["p99_ms"] or 0 for r in rows for o in r["others"]), default=0)
    return {
        "items": items, "rate": RATE, "rows": rows,
        "verdicts": [
            verdict(not failed, f"{len(rows) - len(failed)} of {len(rows)} maximal requests "
                                "answered 200" + (f" (not: {', '.join(failed)})" if failed
                                                  else "") + " (target: all)"),
            verdict(errors == 0,
                    f"{errors} non-200 among the {during:,} ordinary requests sent during "
                    f"them; their p99 was {ms(worst)} ms at worst (target: 0 non-200)"),
        ],
    }


def render(f: dict[str, Any]) -> list[str]:
    lines = [
        "The whole default repository. For each route, a child process sends ordinary",
        f"one-query requests at {f['rate']:.0f} req/s to the route and {f['rate']:.0f} req/s to "
        f"`/v1/search` (open loop) for {WARMUP_S + BEFORE_S:.0f} s (the first second a "
        "warm-up, left out), then the",
        f"maximal request is sent ({f['items']:,} items, each cut at its model's",
        "`max_sequence_length` tokens; `spell` queries of 64 words, its `max_words`; one",
        "text, or one pair, as long as the 8 MiB body limit allows; for",
        "`/v1/search` one 64-word query with k 100). \"During\" counts the ordinary requests",
        "in flight at any moment between its send and its answer; \"before\", those answered",
        "in the seconds before it was sent.",
        "",
        "| route | maximal request | its status, time | ordinary requests during it: "
        "route / `/v1/search` (sent, non-200, p99 ms) | their p99 before (ms) |",
        "|---|---|---|---|---|",
    ]
    for r in f["rows"]:
        during = " / ".join(f"{o['during']['requests']}, {o['during']['non_200']}, "
                            f"{ms(o['during']['p99_ms'])}" for o in r["others"])
        before = " / ".join(ms(o["before"]["p99_ms"]) for o in r["others"])
        items = f"{r['items']:,} item{'s' if r['items'] != 1 else ''}"
        lines.append(f"| {r['route']} | {items}, {r['request_mb']:.2f} MB | "
                     f"{r['status']}, {r['seconds']:.2f} s | {during} | {before} |")
    return lines
