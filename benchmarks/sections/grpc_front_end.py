"""Section 12, KServe v2 over gRPC against HTTP on one server: `embed` served alone on every
core with both front ends on, measured by perf_analyzer (`-i grpc` and `-i http`, the same
closed-loop loads) and by `queryserve bench` (the max rate at p99 <= 10 ms over gRPC and over
HTTP with binary tensors, the same raw tensors both ways, taking turns).

Run alone, from benchmarks/ (prints the section's markdown; the figures go to
bench-out/make-bench/grpc.json):

    cd benchmarks && ../.venv/bin/python -m sections.grpc_front_end

or as part of `make bench` (`python benchmarks/run.py`, `--only grpc` once a full run exists).
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from perf_analyzer_agreement import run_perf_analyzer

from queryserve.bench.server_process import free_port, peak_rss_mb, serving
from sections.common import OUT, _ms, _rate, bench, log, machine_line, one_model_repository

PERF_ANALYZER_LOADS = (("concurrency", 1.0), ("concurrency", 4.0), ("concurrency", 16.0))
SEARCH_ROUNDS = 2
"""Max-rate searches per protocol, taking turns: the machine's own load drifts within minutes,
so one run of each, one after the other, could show the drift rather than the protocol."""
PROTOCOLS = (("HTTP, binary tensors", "kserve-binary"), ("gRPC, raw tensors", "grpc"))


def measure() -> dict[str, Any]:
    repository = one_model_repository("embed", OUT / "repository-grpc")
    cores = os.cpu_count() or 2
    grpc_port = free_port()
    grpc_url = f"grpc://127.0.0.1:{grpc_port}"
    with serving(repository, cores, cores, OUT / "server-grpc.log",
                 f"127.0.0.1:{grpc_port}") as (url, proc):
        perf: list[dict[str, Any]] = []
        for load in PERF_ANALYZER_LOADS:
            for name, protocol, target in (("http", "http", url), ("grpc", "grpc", grpc_url)):
                log(f"grpc: perf_analyzer -i {protocol}, {load[0]} {load[1]:g}")
                run = run_perf_analyzer(target, "embed", load, 3000, 1000, protocol=protocol)
                perf.append({"load": f"{load[0]} {load[1]:g}", "protocol": name, **run})
        searches: dict[str, list[dict[str, Any]]] = {p: [] for _, p in PROTOCOLS}
        for round_ in range(SEARCH_ROUNDS):
            for _, protocol in PROTOCOLS:
                log(f"grpc: max rate at p99 <= 10 ms over {protocol} (round {round_ + 1})")
                searches[protocol].append(bench(
                    grpc_url if protocol == "grpc" else url, "--protocol", protocol,
                    "--find-max", "--p99-ms", "10", name=f"grpc-{protocol}-{round_ + 1}"))
        rss = peak_rss_mb(proc.pid)
    return {"perf_analyzer": perf, "searches": searches, "rss_mb": rss}


def _searched(results: dict[str, Any]) -> dict[str, Any]:
    step = results["search"].get("step")
    return {} if step is None else dict(results["steps"][step])


def render(figures: dict[str, Any]) -> list[str]:
    lines = [
        "## 12. KServe v2 over gRPC against HTTP, one server",
        "",
        "`embed` served alone (`model_repository/embed/model.yaml` as shipped) by one",
        "`queryserve serve --grpc 127.0.0.1:PORT` on every core, HTTP and gRPC at once; the",
        "clients share those cores. Both protocols carry the same raw tensors: KServe v2 binary",
        "tensors over HTTP, `raw_input_contents` / `raw_output_contents` over gRPC.",
        "",
        "### perf_analyzer, `-i http` against `-i grpc`",
        "",
        "The same closed-loop loads, 1,000 MASSIVE queries (`--input-data`), one query per",
        "request; server figures are perf_analyzer's own read of the statistics extension (over",
        "the protocol it drives). Command: `perf_analyzer -m embed -u HOST:PORT -i PROTOCOL",
        "--input-data input.json -b 1 --concurrency-range N --measurement-mode count_windows",
        "--measurement-request-count 3000 --max-trials 3 --stability-percentage 999",
        "--percentile 99`.",
        "",
        "| load | protocol | infer/s | p50 (ms) | p99 (ms) | client mean (ms) | server mean (ms) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for run in figures["perf_analyzer"]:
        lines.append(f"| {run['load']} | {run['protocol']} | {run['throughput']:,.1f} | "
                     f"{_ms(run['p50_ms'])} | {_ms(run['p99_ms'])} | "
                     f"{_ms(run.get('client_mean_ms'))} | {_ms(run.get('server_mean_ms'))} |")
    lines += [
        "",
        "### Max req/s at p99 <= 10 ms, `queryserve bench`",
        "",
        f"The open-loop search of section 2, {SEARCH_ROUNDS} rounds per protocol taking turns;",
        "the max is the median of the rounds. The gRPC load generator is grpc.aio and spends",
        "more CPU per request than the HTTP one (its raw sockets and httptools): the client CPU",
        "column shows how much of the shared cores each took from the server, so on a small",
        "machine the gRPC figure is a floor and perf_analyzer's table above is the fairer",
        "protocol comparison.",
        "",
        "| protocol | max req/s (median) | each round | p50 / p99 at the max (ms) "
        "| client CPU per request (us) | command |",
        "|---|---:|---|---|---:|---|",
    ]
    for label, protocol in PROTOCOLS:
        rounds = figures["searches"][protocol]
        rates = [r["search"]["max_rate"] for r in rounds]
        best = _searched(rounds[rates.index(max(rates))]) if rates else {}
        latency = best.get("latency_ms", {})
        lines.append(
            f"| {label} | **{_rate(statistics.median(rates))}** | "
            f"{', '.join(_rate(r) for r in rates)} | {_ms(latency.get('p50'))} / "
            f"{_ms(latency.get('p99'))} | {best.get('client_cpu_us_per_request', 'n/a')} | "
            f"`{rounds[0]['command_shown']}` |")
    if figures.get("rss_mb"):
        lines += ["", f"Server peak RSS over the section: {figures['rss_mb']:,.0f} MB."]
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    figures = measure()
    (OUT / "grpc.json").write_text(json.dumps(figures, indent=1, default=str))
    print(f"Machine: {machine_line()}.\n")
    print("\n".join(render(figures)))


if __name__ == "__main__":
    main()
