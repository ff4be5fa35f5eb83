"""Section 2, the served default config over HTTP, one query per request (open loop, load
generator on the same cores): max rate at p99 <= 10 ms, p50 / p99 at 100 req/s, peak RSS, and
`perf_analyzer` against `queryserve bench` on the same server and load, sharing the server's
cores and again with each tool on a core of its own."""

from __future__ import annotations

import os
from typing import Any

from perf_analyzer_agreement import compare

from queryserve.bench.server_process import peak_rss_mb, serving
from sections.common import OUT, ROOT, _ms, _rate, bench, log, one_model_repository

AGREEMENT_LOADS = (("concurrency", 4.0), ("rate", 200.0))


def measure() -> dict[str, Any]:
    with serving(ROOT / "model_repository", os.cpu_count() or 2, os.cpu_count() or 2,
                 OUT / "server.log") as (url, proc):
        log("server: max rate at p99 <= 10 ms")
        at_max = bench(url, "--find-max", "--p99-ms", "10", name="max-p99-10ms")
        log("server: 100 req/s for 10 s")
        at_100 = bench(url, "--rate", "100", "--duration", "10", name="rate-100")
        log("server: perf_analyzer and queryserve bench, same server, same load")
        agreement = [compare(url, "embed", load, 3000, 10.0, 1000) for load in AGREEMENT_LOADS]
        rss = peak_rss_mb(proc.pid)
    return {"max": at_max, "at_100": at_100, "agreement": agreement, "rss_mb": rss,
            "agreement_pinned": pinned_agreement()}


def pinned_agreement() -> list[dict[str, Any]]:
    """The two tools again, each on a core of its own against `embed` served on the other:
    neither tool then takes CPU from the server, so what is left is how each measures."""
    server_cpu, client_cpu = sorted(os.sched_getaffinity(0))[:2]
    repository = one_model_repository("embed", OUT / "repository-embed")
    with serving(repository, 1, os.cpu_count() or 2, OUT / "server-pinned.log") as (url, _):
        log(f"server: the same comparison, server on CPU {server_cpu}, tools on {client_cpu}")
        return [compare(url, "embed", load, 3000, 10.0, 1000, cpus=str(client_cpu))
                for load in AGREEMENT_LOADS]


def searched(results: dict[str, Any]) -> dict[str, Any] | None:
    """The step that set a search's max rate."""
    step = results["search"].get("step")
    return None if step is None else dict(results["steps"][step])


def render(server: dict[str, Any]) -> list[str]:
    at_max, at_100 = server["max"], server["at_100"]
    best = searched(at_max) or {}
    fixed = at_100["steps"][0]
    lat_best, lat_fixed = best.get("latency_ms", {}), fixed["latency_ms"]
    srv = fixed.get("server") or {}
    lines = [
        "## 2. The served default config over HTTP, one query per request",
        "",
        "`model_repository/embed/model.yaml` as shipped, served by `queryserve serve` on both",
        "cores with the rest of the default repository loaded and idle (the peak RSS is the",
        "whole repository's: five models and the search index); the load generator",
        "(`queryserve bench`, open loop: latency from each request's scheduled send time)",
        "shares those cores. The max rate is the highest with p99 <= 10 ms,",
        "every request answered 200 and >= 95% of the rate achieved (a doubling ramp that ends",
        "at two failing levels in a row, then bisection below the first; each probe the",
        "majority of two or three 3 s runs).",
        "",
        "| figure | value | command |",
        "|---|---|---|",
        f"| max req/s at p99 <= 10 ms | **{_rate(at_max['search']['max_rate'])}** (p50 "
        f"{_ms(lat_best.get('p50'))} / p99 {_ms(lat_best.get('p99'))} ms there) | "
        f"`{at_max['command_shown']}` |",
        f"| p50 / p99 at 100 req/s, 10 s | {_ms(lat_fixed.get('p50'))} / "
        f"{_ms(lat_fixed.get('p99'))} ms (server: queue {_ms(srv.get('queue_ms_per_request'))} "
        f"+ compute {_ms(srv.get('compute_ms_per_request'))} ms per request, mean batch "
        f"{srv.get('mean_batch')}) | `{at_100['command_shown']}` |",
        f"| server peak RSS over the whole section | {server['rss_mb']:,.0f} MB | "
        "`VmHWM` of the server process |",
        "",
        "### perf_analyzer and `queryserve bench` on the same server and load",
        "",
        "Same running server, same 1,000 MASSIVE queries (perf_analyzer's `--input-data`), same",
        "requests (KServe v2 binary tensors in and out, perf_analyzer's default); the",
        "tools take turns, three runs each, and each row is the median of a tool's runs (one",
        "run each, one after the other, drifted apart with the machine's load). The bar is",
        "agreement within 10% on throughput and p99. Commands:",
        "`python benchmarks/perf_analyzer_agreement.py --concurrency 4` and `--rate 200`, which",
        "run:",
        "",
    ]
    for item in server["agreement"]:
        lines += [f"- `{item['perf_analyzer']['command']}`",
                  f"- `{item['queryserve_bench']['command']}`"]
    lines += ["", *agreement_table(server["agreement"])]
    pinned = server.get("agreement_pinned")
    if pinned:
        lines += [
            "",
            "The same comparison with each tool on a core of its own (`--client-cpus 1`, the",
            "commands above under `taskset -c 1`) against `embed` alone served on the other core",
            "(`queryserve serve --cores 1`, two instances sharing it): the tools no longer take",
            "CPU from the server, so what is left is how each one measures.",
            "",
            *agreement_table(pinned),
        ]
        split = [i for i in pinned if "client_mean_ms" in i["perf_analyzer"]]
        if split:
            lines += ["", "perf_analyzer's own split of its mean latency: " + "; ".join(
                f"{i['load']}: {i['perf_analyzer']['client_mean_ms']:.2f} ms at the client "
                f"against {i['perf_analyzer']['server_mean_ms']:.2f} ms that the server reports"
                for i in split) + "."]
    return lines


def agreement_table(items: list[dict[str, Any]]) -> list[str]:
    lines = ["| load | tool | req/s | p50 (ms) | p99 (ms) | each run: req/s, p99 (ms) |",
             "|---|---|---:|---:|---:|---|"]
    for item in items:
        for tool in ("perf_analyzer", "queryserve_bench"):
            r = item[tool]
            each = "; ".join(f"{run['throughput']:,.1f}, {_ms(run['p99_ms'])}"
                             for run in r.get("runs", []))
            lines.append(f"| {item['load']} | {tool.replace('_', ' ')} | "
                         f"{r['throughput']:,.1f} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | "
                         f"{each} |")
        lines.append(f"| {item['load']} | **ratio** (queryserve bench / perf_analyzer) | "
                     f"**{item['throughput_ratio']:.3f}** | | **{item['p99_ratio']:.3f}** | |")
    return lines
