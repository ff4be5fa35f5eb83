"""Measure the peers one after another with `queryserve bench`; print a table, write JSON.

For each peer: start it, wait until a real query answers 200, run one `queryserve bench
--find-max` search per p99 threshold (default 10, 50 and 1000 ms; the last one stands for "max
throughput"), stop it. Only one server runs at a time, and the load generator shares the cores
with it, as for queryserve's own figures.

    python benchmarks/peers/peers.py install                  # once
    python benchmarks/peers/run_peers.py                      # all peers
    python benchmarks/peers/run_peers.py --peers fastapi-st,pytriton --p99-ms 10 50 1000 \
        --bench-arg=--step-duration --bench-arg=5             # extra flags for queryserve bench
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import PEERS, QUERIES, ROOT, Peer, PeerError, load_queries, wait_ready

QUERYSERVE = ROOT / ".venv" / "bin" / "queryserve"
DEFAULT_P99_MS = (10.0, 50.0, 1000.0)
DEFAULT_OUT = ROOT / "bench-out" / "peers"


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    """The load generator must sit in the peer's namespace to reach its 127.0.0.1."""
    return argv if netns is None else ["ip", "netns", "exec", netns, *argv]


def bench_command(
    peer: Peer, base_url: str, p99_ms: float, out: Path, queries: Path, extra: Sequence[str]
) -> list[str]:
    """`queryserve bench` for one find-max search; it writes ``out/results.json``."""
    return in_netns(peer.netns, [
        str(QUERYSERVE), "bench", base_url,
        "--model", peer.model, "--protocol", peer.protocol, "--path", peer.path,
        "--queries", str(queries), "--find-max", "--p99-ms", f"{p99_ms:g}",
        "--out", str(out), "--no-progress",
        *(f"--header={name}:{value}" for name, value in peer.headers.items()), *extra,
    ])


def run_search(argv: list[str], out: Path) -> dict[str, Any]:
    """Run one search (its output goes to ``out/bench.log``); its results.json."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "bench.log").open("w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode != 0:
        raise PeerError(f"load generator exited with {done.returncode}; see {out / 'bench.log'}")
    return dict(json.loads((out / "results.json").read_text()))


def best_step(results: dict[str, Any]) -> dict[str, Any] | None:
    """The step the search settled on (``search.step``), else the fastest one under the bar."""
    steps, search = results.get("steps", []), results["search"]
    if isinstance(search.get("step"), int) and 0 <= search["step"] < len(steps):
        return dict(steps[search["step"]])
    limit = search["threshold_ms"]
    ok = [s for s in steps if (s["latency_ms"].get("p99") or 1e18) <= limit]
    return max(ok, key=lambda s: s["throughput"]) if ok else None


def measure(peer: Peer, port: int, p99s: Sequence[float], out_root: Path, queries: Path,
            extra: Sequence[str]) -> dict[str, Any]:
    """Start the peer, run one search per threshold, stop it."""
    row: dict[str, Any] = {"peer": peer.name, "label": peer.label, "searches": {}}
    with peer.running(port) as run:
        row["ready_s"] = round(wait_ready(run, peer.body(load_queries(1, queries))), 1)
        print(f"{peer.name}: ready in {row['ready_s']} s", flush=True)
        for p99 in p99s:
            out = out_root / peer.name / f"p99-{p99:g}ms"
            argv = bench_command(peer, f"http://127.0.0.1:{port}", p99, out, queries, extra)
            res = run_search(argv, out)
            step = best_step(res)
            row["searches"][f"{p99:g}"] = {
                "max_rate": res["search"]["max_rate"],
                "p50_ms": step["latency_ms"].get("p50") if step else None,
                "p99_ms": step["latency_ms"].get("p99") if step else None,
                "results": str(out / "results.json"),
            }
            print(f"{peer.name}: p99 <= {p99:g} ms -> {res['search']['max_rate']} req/s",
                  flush=True)
    return row


def _cell(search: dict[str, Any] | None) -> str:
    if not search or not search["max_rate"]:
        return "none passed"
    lat = ""
    if search["p50_ms"] is not None:
        lat = f" ({search['p50_ms']:.1f} / {search['p99_ms']:.1f})"
    return f"{search['max_rate']:.0f}{lat}"


def markdown(rows: Sequence[dict[str, Any]], p99s: Sequence[float]) -> str:
    head = " | ".join(f"req/s @ p99 <= {p:g} ms (p50 / p99 ms)" for p in p99s)
    lines = [f"| peer | {head} | ready (s) |", "|---" + "|---:" * (len(p99s) + 1) + "|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['label']} | failed: {row['error'].splitlines()[0]} |")
            continue
        cells = " | ".join(_cell(row["searches"].get(f"{p:g}")) for p in p99s)
        lines.append(f"| {row['label']} | {cells} | {row['ready_s']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated, in order (default: {','.join(PEERS)})")
    ap.add_argument("--p99-ms", type=float, nargs="+", default=list(DEFAULT_P99_MS),
                    help="one find-max search per threshold (default: 10 50 1000)")
    ap.add_argument("--port", type=int, default=8700)
    ap.add_argument("--queries", type=Path, default=QUERIES)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--bench-arg", action="append", default=[],
                    help="extra argument for the load generator (repeat; use --bench-arg=--flag)")
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running peer's context manager still stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [n for n in args.peers.split(",") if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        ap.error(f"unknown peer(s) {unknown}; known: {', '.join(PEERS)}")
    if not os.access(QUERYSERVE, os.X_OK):
        ap.error(f"{QUERYSERVE} not found: run `make setup`")

    rows = []
    for name in names:
        try:
            rows.append(measure(PEERS[name], args.port, args.p99_ms, args.out.resolve(),
                                args.queries.resolve(), args.bench_arg))
        except (PeerError, OSError, KeyError, ValueError) as err:
            print(f"{name}: FAILED: {err}", flush=True)
            rows.append({"peer": name, "label": PEERS[name].label, "error": str(err)})
    table = markdown(rows, args.p99_ms)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "p99_ms": args.p99_ms, "peers": rows, "table": table}
    (args.out / "peers.json").write_text(json.dumps(report, indent=2))
    print(table)
    print(f"\nwritten: {args.out / 'peers.json'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
