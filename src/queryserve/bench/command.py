"""The `queryserve bench` and `queryserve recommend` command lines: flags in, results out.

The parser is cheap to build; the bench tools (load generator, rich, the report writers) are
imported only when the command runs, so `queryserve serve` never loads them.
"""

from __future__ import annotations

import argparse
import datetime
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from queryserve.arguments import count, folder_to_write, non_negative, positive
from queryserve.bench.payloads import PROTOCOLS
from queryserve.config import MAX_BATCH_OVERHEAD_TOKENS

N = TypeVar("N", int, float)


def _number_list(cast: Callable[[str], N], what: str, example: str, *,
                 above: float) -> Callable[[str], list[N]]:
    """An argparse type for comma-separated numbers, each > ``above``."""

    def parse(value: str) -> list[N]:
        try:
            numbers = [cast(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a list of {what}, e.g. {example}") from None
        if not numbers or any(not n > above or not math.isfinite(n) for n in numbers):
            raise argparse.ArgumentTypeError(f"{value!r}: {what} must be > {above:g}")
        return numbers

    return parse


_rates = _number_list(float, "rates", "100,200,400", above=0)
_users = _number_list(int, "user counts", "1,4,16", above=0)
_ints = _number_list(int, "integers", "0,1000,4000", above=-1)
_counts = _number_list(int, "counts", "1,2,4", above=0)


def _phase(value: str) -> tuple[int, float, float]:
    parts = value.split(":")
    try:
        users, spawn, seconds = (int(parts[0]), 0.0, float(parts[1])) if len(parts) == 2 else (
            int(parts[0]), float(parts[1]), float(parts[2]))
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not USERS:SECONDS or USERS:SPAWN_PER_S:SECONDS, e.g. 8:2:30") from None
    if users < 1 or not spawn >= 0 or not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{value!r}: need users >= 1, spawn >= 0, seconds > 0")
    return users, spawn, seconds


# The real query sets in the repository's data/ (see each folder's SOURCE.md), found from this
# file so the names work from any directory of a source checkout (`make setup` installs it
# editable).
_DATA = Path(__file__).resolve().parents[3] / "data"
QUERY_SETS = {"massive": _DATA / "massive-en" / "test.jsonl",
              "catalog": _DATA / "catalog-titles" / "titles.txt"}


def _queries(value: str) -> Path:
    return QUERY_SETS.get(value, Path(value))


def _header(value: str) -> tuple[str, str]:
    name, sep, content = value.partition(":")
    if not sep or not name.strip() or any(c in value for c in "\r\n"):
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME:VALUE, e.g. x-token:abc")
    return name.strip(), content.strip()


def add_bench_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser(
        "bench", help="load a server with real queries: latency percentiles, max rate, cost",
        description="Load one server with real queries (open loop by default: latency counts "
                    "from each request's scheduled send time) and report throughput, latency "
                    "percentiles, the server's queue/compute split and cost per inference. "
                    "Without a load shape it searches the highest rate whose p99 stays under "
                    "--p99-ms.")
    bench.add_argument("url", help="server, e.g. http://127.0.0.1:8000, or its gRPC address "
                                   "grpc://127.0.0.1:8001 with --protocol grpc (loopback only)")
    bench.add_argument("--model", default="embed", help="model name (default: %(default)s)")
    bench.add_argument("--protocol", choices=PROTOCOLS, default="kserve",
                       help="request format: KServe v2 JSON or binary, KServe v2 gRPC "
                            "(ModelInfer, raw tensors; open loop only), OpenAI embeddings, "
                            "or a task route (/v1/spell, /v1/intent, /v1/search, /v1/duplicates) "
                            "(default: %(default)s)")
    bench.add_argument("--path", default=None,
                       help="route to POST to (default: the protocol's, e.g. "
                            "/v2/models/MODEL/infer; {model} is replaced)")
    bench.add_argument("--queries", type=_queries, default=QUERY_SETS["massive"],
                       help="real queries: 'massive' (MASSIVE en-US test utterances, the "
                            "default), 'catalog' (8,788 product titles), or a file: .jsonl "
                            "(field --field) or one query per line")
    bench.add_argument("--field", default="text", help="JSON field of --queries to use")
    bench.add_argument("--items-per-request", type=count, default=1,
                       help="queries per request (default: %(default)s)")
    bench.add_argument("--input-name", default="text", help="KServe input tensor name")
    shape = bench.add_mutually_exclusive_group()
    shape.add_argument("--rate", type=positive, help="one open-loop step at this rate (req/s)")
    shape.add_argument("--rates", type=_rates, help="open-loop sweep, e.g. 100,200,400,800")
    shape.add_argument("--find-max", action="store_true",
                       help="search the highest rate whose --percentile stays <= --p99-ms "
                            "(the default)")
    shape.add_argument("--phase", type=_phase, action="append",
                       help="closed-loop phase USERS[:SPAWN_PER_S]:SECONDS; repeat for "
                            "several phases in a row")
    shape.add_argument("--users", type=_users, help="closed-loop sweep of user counts, e.g. 1,4,16")
    bench.add_argument("--duration", type=positive, default=None,
                       help="seconds per step (default: 3 in a search, 10 otherwise)")
    bench.add_argument("--warmup", type=non_negative, default=1.0,
                       help="unmeasured seconds per step")
    bench.add_argument("--poisson", action="store_true", help="Poisson arrivals, not constant")
    bench.add_argument("--p99-ms", type=positive, default=None, dest="threshold_ms",
                       help="latency bar: the search's target (default 10) and, in sweeps, a "
                            "stop condition")
    bench.add_argument("--percentile", choices=["p50", "p90", "p95", "p99", "p99.9"],
                       default="p99", help="which percentile --p99-ms bounds")
    bench.add_argument("--start-rate", type=positive, default=50.0)
    bench.add_argument("--max-rate", type=positive, default=20_000.0)
    bench.add_argument("--min-rate", type=positive, default=5.0,
                       help="the search halves the start rate down to this before giving up")
    bench.add_argument("--max-invocations-per-minute", type=positive, default=None,
                       help="stop a sweep once this many inferences per minute are reached")
    bench.add_argument("--stop-on-flat", type=positive, default=None, metavar="RATIO",
                       help="stop a sweep when throughput grows by less than RATIO (e.g. 0.05)")
    bench.add_argument("--price-per-hour", type=positive, default=None,
                       help="what the server's machine costs per hour: adds cost per million "
                            "inferences")
    bench.add_argument("--header", action="append", type=_header, default=[],
                       metavar="NAME:VALUE",
                       help="extra HTTP header (gRPC: metadata) on every request and stats "
                            "read (repeat)")
    bench.add_argument("--connections", type=count, default=4,
                       help="connections opened up front (open loop; gRPC: channels, each "
                            "one connection)")
    bench.add_argument("--max-connections", type=count, default=256,
                       help="most connections the open loop may open (gRPC: most calls in "
                            "flight)")
    bench.add_argument("--out", type=folder_to_write, default=None,
                       help="folder for results.json/.csv, report.html and plots "
                            "(default: bench-out/bench-DATE-TIME)")
    bench.add_argument("--no-progress", action="store_true", help="plain lines, no live bar")


def _check_rates(args: argparse.Namespace) -> None:
    """Before any server is started or reached (a traceback after one was, in recommend)."""
    from queryserve.errors import BenchError

    if args.start_rate > args.max_rate:
        raise BenchError(f"--start-rate {args.start_rate:g} is above --max-rate "
                         f"{args.max_rate:g}: the search starts at the first and stops at the "
                         "second")


def run_bench_command(args: argparse.Namespace) -> None:
    from rich.console import Console

    from queryserve.bench.bench import BenchPlan, Phase, endpoint_url, run_bench
    from queryserve.bench.console import LiveSteps, PlainSteps, print_summary
    from queryserve.bench.payloads import build_payloads, read_queries
    from queryserve.bench.report import write_bench_report
    from queryserve.bench.search import StopConditions
    from queryserve.errors import BenchError

    _check_rates(args)
    if args.items_per_request < 1:
        raise BenchError("--items-per-request must be >= 1")
    queries = read_queries(args.queries, args.field)
    payloads = build_payloads(args.protocol, queries, model=args.model,
                              items_per_request=args.items_per_request,
                              input_name=args.input_name)
    if args.rate is not None or args.rates is not None:
        shape, rates, phases = "sweep", args.rates or [args.rate], []
    elif args.phase or args.users:
        phases = ([Phase(u, s, d) for u, s, d in args.phase] if args.phase else
                  [Phase(u, 0.0, args.duration or 10.0) for u in args.users])
        shape, rates = "phases", []
    else:
        shape, rates, phases = "search", [], []
    threshold = args.threshold_ms if args.threshold_ms is not None else (
        10.0 if shape == "search" else None)
    plan = BenchPlan(
        url=endpoint_url(args.url, args.protocol, args.model, args.path),
        model=args.model, protocol=args.protocol, payloads=payloads, shape=shape,
        rates=rates, phases=phases,
        duration_s=args.duration or (3.0 if shape == "search" else 10.0),
        warmup_s=args.warmup, poisson=args.poisson, threshold_ms=threshold,
        percentile=args.percentile, start_rate=args.start_rate, max_rate=args.max_rate,
        min_rate=min(args.min_rate, args.start_rate),
        stop=StopConditions(latency_ms=threshold if shape != "search" else None,
                            percentile=args.percentile,
                            max_invocations_per_minute=args.max_invocations_per_minute,
                            flat_ratio=args.stop_on_flat),
        price_per_hour=args.price_per_hour, connections=args.connections,
        max_connections=args.max_connections, headers=dict(args.header))
    console = Console(stderr=True)
    observer = PlainSteps() if args.no_progress else LiveSteps(console)
    if shape == "search":
        console.print(f"searching the highest rate with {args.percentile} <= {threshold:g} ms "
                      f"at {plan.url}", highlight=False)
    results = run_bench(plan, observer)
    out = args.out or Path("bench-out") / datetime.datetime.now().strftime(
        "bench-%Y%m%d-%H%M%S")
    written = write_bench_report(results, out)
    print_summary(results, [str(p) for p in written], Console())
    if (ended := results.get("ended_early")) is not None:  # what was measured is written
        if ended.startswith("interrupted"):
            raise KeyboardInterrupt
        raise BenchError(f"{ended}; the steps measured before are in {out}")
    answers: Counter[str] = Counter()
    for step in results["steps"]:
        answers.update(step["by_status"])
    errors = sum(step["errors"] for step in results["steps"])
    if (answers or errors) and not any(status.startswith("2") for status in answers):
        # The report is written (it shows what the server said); the exit status must not
        # pass a run in which nothing was measured.
        said = [f"{times} x {status}" for status, times in sorted(answers.items())]
        # The load keeps no bodies: one request more says why (the client's own mistakes
        # were refused before the load, so this is the server's state: not ready, failing).
        from queryserve.bench.first_request import first_answer

        answer = first_answer(plan.url, plan.protocol, plan.payloads, plan.headers)
        why = (f"; sent once more, the first request was answered {answer[0]}: {answer[1]}"
               if answer is not None else "; check the URL and that the server is up")
        raise BenchError(f"no request succeeded at {plan.url} ({', '.join(said) or 'no answers'}"
                         f"; {errors} errors){why}")
    search = results.get("search")
    if search is not None and search["max_rate"] <= 0:  # a script gates on the exit status
        raise BenchError(f"no rate met {search['percentile']} <= {search['threshold_ms']:g} "
                         f"ms; the steps tried are in {out}")


def _names(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{value!r} names nothing")
    return names


def _spinning(value: str) -> list[bool]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names or any(n not in ("off", "on") for n in names):
        raise argparse.ArgumentTypeError(f"{value!r}: use off, on or off,on")
    return [n == "on" for n in dict.fromkeys(names)]


def _overheads(value: str) -> list[int | None]:
    out: list[int | None] = []
    for item in _names(value):
        if item != "none" and not (item.isdigit()
                                   and int(item) <= MAX_BATCH_OVERHEAD_TOKENS):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a batch overhead: use whole numbers of tokens from 0 to "
                f"{MAX_BATCH_OVERHEAD_TOKENS}, or none (as few batches as the limits allow), "
                "e.g. none,1,4,16")
        out.append(None if item == "none" else int(item))
    return list(dict.fromkeys(out))


def _layouts(value: str) -> list[tuple[int, int]]:
    out = []
    for item in _names(value):
        instances, _, threads = item.partition("x")
        if not (instances.isdigit() and threads.isdigit()) or "0" in (instances, threads):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not INSTANCESxTHREADS, e.g. 2x1 (both >= 1)")
        out.append((int(instances), int(threads)))
    return out


def add_recommend_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rec = commands.add_parser(
        "recommend", help="find the model config with the most throughput (or least cost) "
                          "under a latency bar",
        description="Serve the model in each candidate configuration (precision, max batch "
                    "size, batch overhead, max queue delay, instances x threads, workers), find "
                    "each one's highest rate under the latency bar with the open-loop search, mark "
                    "the Pareto front and write the winning model.yaml. Staged by default (one "
                    "knob at a time around the best so far); finished points are kept, so an "
                    "interrupted sweep resumes where it stopped.")
    rec.add_argument("--model", default="embed", help="model name (default: %(default)s)")
    rec.add_argument("--repository", type=Path, default=Path("model_repository"),
                     help="model repository (default: %(default)s)")
    rec.add_argument("--p99-ms", type=positive, default=10.0, dest="threshold_ms",
                     help="latency bar (default: %(default)s)")
    rec.add_argument("--percentile", choices=["p50", "p90", "p95", "p99", "p99.9"],
                     default="p99", help="which percentile --p99-ms bounds")
    rec.add_argument("--objective", choices=["throughput", "cost"], default="throughput",
                     help="most req/s, or least cost per inference (needs --price-per-hour)")
    rec.add_argument("--price-per-hour", type=positive, default=None,
                     help="the machine's price per hour; a point using fewer cores is charged "
                          "its share")
    rec.add_argument("--grid", choices=["staged", "full"], default="staged",
                     help="staged: one knob at a time (about 10 points); full: every "
                          "combination")
    rec.add_argument("--precisions", type=_names, default=None,
                     help="model variants to try (default: every one that passed its gate)")
    rec.add_argument("--layouts", type=_layouts, default=None,
                     help="instances x threads to try, e.g. 1x2,2x1 (default: all that fit)")
    rec.add_argument("--workers", type=_counts, default=None,
                     help="server worker processes to try, the cores split between them, "
                          "e.g. 1,2,4 (default: 1 and each power of two up to the cores)")
    rec.add_argument("--spinning", type=_spinning, default=None,
                     help="ONNX Runtime thread spinning to try with multi-thread layouts: off, "
                          "on or off,on (default: off,on for ONNX models)")
    rec.add_argument("--max-batch-sizes", type=_counts, default=None,
                     help="e.g. 8,16,64 (default: 8,16,64 and the current one)")
    rec.add_argument("--delays-us", type=_ints, default=None,
                     help="max queue delays, e.g. 0,1000,4000 (default: those and the current)")
    rec.add_argument("--overheads", type=_overheads, default=None,
                     help="the batcher's batch_overhead_tokens to try, e.g. none,1,4,16 "
                          "(default: those and the current; none: as few batches as the "
                          "limits allow)")
    rec.add_argument("--queries", type=_queries, default=QUERY_SETS["massive"],
                     help="'massive' (default), 'catalog' or a file, as for bench")
    rec.add_argument("--field", default="text", help="JSON field of --queries to use")
    rec.add_argument("--step-duration", type=positive, default=2.0,
                     help="seconds per search run (default: %(default)s)")
    rec.add_argument("--start-rate", type=positive, default=100.0,
                     help="the search's first rate, req/s (default: %(default)s)")
    rec.add_argument("--max-rate", type=positive, default=20_000.0,
                     help="the search never offers more, req/s (default: %(default)s)")
    rec.add_argument("--out", type=folder_to_write, default=Path("bench-out/recommend"),
                     help="results, plots, state for resuming, the winning model.yaml "
                          "(default: %(default)s)")
    rec.add_argument("--no-progress", action="store_true", help="plain lines, no live bar")


def run_recommend_command(args: argparse.Namespace) -> None:
    from rich.console import Console

    from queryserve.bench.console import LiveSteps, PlainSteps, print_recommendation
    from queryserve.bench.payloads import build_payloads, read_queries
    from queryserve.bench.recommend import Sweep, run_recommend
    from queryserve.bench.recommend_plan import Knobs, Point
    from queryserve.bench.report import write_recommend_report
    from queryserve.errors import BenchError

    if args.objective == "cost" and args.price_per_hour is None:
        raise BenchError("--objective cost needs --price-per-hour")
    _check_rates(args)
    payloads = build_payloads("kserve", read_queries(args.queries, args.field), model=args.model)
    sweep = Sweep(repository=args.repository, model=args.model, payloads=payloads,
                  threshold_ms=args.threshold_ms, percentile=args.percentile,
                  objective=args.objective, price_per_hour=args.price_per_hour,
                  grid=args.grid, step_duration_s=args.step_duration,
                  start_rate=args.start_rate, max_rate=args.max_rate, out_dir=args.out,
                  # Knobs not given stay empty: run_recommend takes the model's defaults.
                  knobs=Knobs(tuple(args.precisions or ()), tuple(args.layouts or ()),
                              tuple(args.max_batch_sizes or ()), tuple(args.delays_us or ()),
                              tuple(args.spinning or ()), tuple(args.overheads or ()),
                              tuple(args.workers or ())))
    console = Console(stderr=True)
    observer = PlainSteps() if args.no_progress else LiveSteps(console)

    def on_point(i: int, total: int | None, point: Point, record: dict[str, object] | None,
                 kept: bool) -> None:
        of = f"/{total}" if total else ""
        if record is None:
            console.print(f"[bold]point {i}{of}: {point.id}[/] (serving on {point.cores} "
                          f"core{'s' * (point.cores > 1)})", highlight=False)
            return
        if kept:
            console.print(f"[bold]point {i}{of}: {point.id}[/] (measured in an earlier run, "
                          f"kept in {args.out / 'recommend-state.json'})", highlight=False)
        if record.get("error"):
            console.print(f"  [red]failed: {record['error']}[/]", highlight=False)
        else:
            console.print(f"  -> {record['max_rate']:,.0f} req/s under the bar",
                          highlight=False)

    results = run_recommend(sweep, observer, on_point)
    written = write_recommend_report(results, args.out)
    if results.get("best_model_yaml"):
        path = args.out / "model.yaml"
        path.write_text(results["best_model_yaml"])
        written.append(path)
    print_recommendation(results, [str(p) for p in written], Console())
    if not any(p.get("max_rate") for p in results["points"]):  # a script gates on the status
        raise BenchError(f"no configuration served a rate under the bar; the points and their "
                         f"errors are in {args.out}")
