"""`queryserve serve --workers N` scaling in one time-bounded run (for a lent 16-core machine).

For each planned run, in order: a one-model repository, `queryserve serve --cores C --workers N
--grpc off` pinned to the server's cores, `queryserve bench URL --find-max --p99-ms 10` (through
bench_fast.py: the CLI's own search, no plots) pinned to the client's cores, the peak RSS
(VmHWM of the server and its child processes, summed, read before SIGTERM). After each run
$OUT/workers16.json is rewritten, so a kill keeps what was done; past the deadline nothing new
starts and a running search is stopped (its passing trials so far are kept as a lower bound).

Environment (defaults for a 16-core machine):
  DEADLINE_S=185     seconds from start after which nothing runs
  PLAN="fake:1,4,8,14 embed:1,8,14"
                     model:N,N,... in priority order; "fake-c64:14" would open 64 connections
                     up front instead of bench's 4; "embed-c64-i1:7" sets instance_group.count to
                     1 instead of the server's cores (a worker runs min(count, its cores)
                     instances: fewer instance threads than cores leaves its event loop a
                     core); "inproc:1,14" is the in-process ceiling
                     (N processes x 1 ONNX Runtime thread running the served embed variant,
                     batch 1, tokenization included, no server: section 13's measure) on the
                     server's cores
  "cuda:1,2,4" serves `embed` in fp16 on the GPU (benchmarks/device/cuda.sh carried the
                     onnxruntime-gpu wheel into CUDA_SITE=/tmp/site-gpu and the model into
                     CUDA_PAYLOAD=/tmp/payw): one CUDA session per worker unless -iK says
                     otherwise; each run records the GPU's memory per process (nvidia-smi)
  "hardpairs" (no counts) serves the `duplicates` cross-encoder alone (.dev16/duplicates, from
                     make_payload.py) and asks it the hard pairs: the decisions on this processor
  INPROC_S=5         seconds each in-process run measures
  CLIENT_CORES=2     cores kept for the load generator (0: share all cores with the server)
  DURATION=0.75 WARMUP=0.25 DRAIN_S=0.5 STATS_TIMEOUT_S=1   seconds per search step
  START_FAKE=2000 START_EMBED=1000 MAX_RATE=200000
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

T0 = time.monotonic()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = Path(os.environ.get("OUT") or "/tmp/workers16-out")
WORK = Path(os.environ.get("WORK") or "/tmp/workers16-work")
DEADLINE = T0 + float(os.environ.get("DEADLINE_S", "185"))
ALL_CPUS = sorted(os.sched_getaffinity(0))
CLIENT_CORES = int(os.environ.get("CLIENT_CORES", "2" if len(ALL_CPUS) >= 8 else "0"))
SERVER_CPUS = ALL_CPUS[:len(ALL_CPUS) - CLIENT_CORES] if CLIENT_CORES else ALL_CPUS
CLIENT_CPUS = ALL_CPUS[len(ALL_CPUS) - CLIENT_CORES:] if CLIENT_CORES else ALL_CPUS
DEFAULT_PLAN = ("fake:1,4,8,14 embed:1,8,14" if len(ALL_CPUS) >= 16
                else "fake:1,2 embed:1,2")
PLAN = os.environ.get("PLAN", DEFAULT_PLAN)
DURATION = os.environ.get("DURATION", "0.75")
WARMUP = os.environ.get("WARMUP", "0.25")
DRAIN_S = os.environ.get("DRAIN_S", "0.5")
STATS_TIMEOUT_S = os.environ.get("STATS_TIMEOUT_S", "1.0")
START = {"fake": float(os.environ.get("START_FAKE", "2000")),
         "embed": float(os.environ.get("START_EMBED", "1000")),
         "cuda": float(os.environ.get("START_CUDA", "2000"))}
CUDA_SITE = Path(os.environ.get("CUDA_SITE", "/tmp/site-gpu"))
CUDA_PAYLOAD = Path(os.environ.get("CUDA_PAYLOAD", "/tmp/payw"))
# Where the lent machine's image keeps CUDA 13's libraries (the onnxruntime-gpu build loads
# libcublas.so.13 and libcudart.so.13; BENCHMARKS.md "GPU", 2026-11-22).
NVIDIA_LIBS = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia"
MAX_RATE = os.environ.get("MAX_RATE", "200000")
MIN_RUN_S = float(os.environ.get("MIN_RUN_S", "15"))  # no run starts with less time left
INPROC_S = float(os.environ.get("INPROC_S", "5"))
PY = sys.executable
sys.path.insert(0, str(ROOT / "src"))
from queryserve.bench.server_process import (  # noqa: E402
    free_port,
    launch,
    peak_rss_mb,
    rss_mb,
    serve_command,
    stop,
    wait_ready,
)

servers: list[subprocess.Popen[bytes]] = []


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {message}", flush=True)


def left() -> float:
    return DEADLINE - time.monotonic()


def write(figures: dict[str, Any]) -> None:
    figures["elapsed_s"] = round(time.monotonic() - T0, 1)
    tmp = OUT / ".workers16.json.tmp"
    tmp.write_text(json.dumps(figures, indent=1))
    os.replace(tmp, OUT / "workers16.json")


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version()}
    for name in ("numpy", "onnxruntime", "tokenizers", "uvloop", "httptools", "orjson", "grpc",
                 "google.protobuf", "yaml", "hdrh"):
        try:
            module = __import__(name, fromlist=["_"])
            found[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # reported, not fatal here
            found[name] = f"missing: {exc}"
    cpu = platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    found["cpu"] = cpu
    found["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return found


# -- repositories --------------------------------------------------------------------------

def embed_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((HERE / "embed" / "model.yaml").read_text())
    return config


def repository(model: str, instances: int) -> Path:
    """A repository with one model named `embed` (bench's default name): the served ONNX
    variant, or the fake backend with the same batching settings. Instances: by default one per
    server core, so each worker runs its share of the cores as 1-thread instances (the server
    caps a worker's instances at its cores)."""
    root = WORK / f"repo-{model}-i{instances}"
    folder = root / "embed"
    folder.mkdir(parents=True, exist_ok=True)
    config = embed_config()
    config["instance_group"] = {"count": instances}
    shutil.copy(HERE / "embed" / "tokenizer.json", folder / "tokenizer.json")
    if model == "cuda" and not (folder / "model.onnx").is_file():
        (folder / "model.onnx").write_bytes(
            lzma.decompress((CUDA_PAYLOAD / "embed" / "model.onnx.xz").read_bytes()))
    if model == "fake":
        config["backend"] = "fake"
        config.pop("pipeline", None)
        config["parameters"] = {k: v for k, v in config["parameters"].items()
                                if k != "model_file"}
    elif model == "embed" and not (folder / "model.onnx").is_file():
        started = time.monotonic()
        (folder / "model.onnx").write_bytes(
            lzma.decompress((HERE / "embed" / "model.onnx.xz").read_bytes()))
        log(f"embed: model.onnx unpacked in {time.monotonic() - started:.1f} s")
    (folder / "model.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


# -- the server ----------------------------------------------------------------------------

def cuda_env() -> dict[str, str]:
    """The server's environment for a `cuda` run: onnxruntime-gpu ahead of the CPU build, and
    CUDA's libraries on the loader's path."""
    libs = sorted(str(p) for p in Path(NVIDIA_LIBS).glob("*/lib"))
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join([str(CUDA_SITE), os.environ.get("PYTHONPATH", "")]),
            "LD_LIBRARY_PATH": os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])}


def gpu_memory() -> dict[str, Any]:
    """Each process's memory on the GPU and the device's total in use (nvidia-smi), MiB."""
    def query(what: str) -> list[list[str]]:
        done = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
        return [[f.strip() for f in line.split(",")] for line in done.stdout.splitlines() if line]
    try:
        apps = query("compute-apps=pid,used_memory")
        used = query("gpu=memory.used,memory.total")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    return {"per_process_mib": {pid: float(mib) for pid, mib in apps},
            "device_used_total_mib": used[0] if used else None}


def start_server(repo: Path, workers: int, log_path: Path,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """In a process group of its own, so that `stop_server` ends the workers too."""
    port = free_port()
    command = serve_command(repo, port, "--grpc", "off", "--cores", str(len(SERVER_CPUS)),
                            "--workers", str(workers))
    log("  $ " + " ".join(command[1:]))
    server = launch(command, port, log_path, env=env, cpus=SERVER_CPUS, own_group=True)
    servers.append(server.process)
    return server.process, server.url


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, its drain bounded by the deadline, then SIGKILL to the group."""
    stop(proc, max(1.0, min(10.0, left() + 5)), group=True)
    if proc in servers:
        servers.remove(proc)


# -- one run -------------------------------------------------------------------------------

def bench(url: str, name: str, start_rate: float, connections: int) -> dict[str, Any]:
    steps_file = WORK / f"steps-{name}.jsonl"
    steps_file.unlink(missing_ok=True)
    command = [PY, str(HERE / "bench_fast.py"), url, "--find-max", "--p99-ms", "10",
               "--duration", DURATION, "--warmup", WARMUP, "--start-rate", f"{start_rate:g}",
               "--max-rate", MAX_RATE, "--queries", str(HERE / "queries.jsonl"),
               "--connections", str(connections),
               "--out", str(WORK / f"bench-{name}"), "--no-progress"]
    log("  $ bench " + " ".join(command[2:]))
    env = {**os.environ, "STEPS_FILE": str(steps_file), "DRAIN_S": DRAIN_S,
           "STATS_TIMEOUT_S": STATS_TIMEOUT_S}
    result: dict[str, Any] = {"bench_args": " ".join(command[3:]).replace(str(WORK), "WORK")
                              .replace(str(HERE), ".dev16")}
    started = time.monotonic()
    with (WORK / f"bench-{name}.log").open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                process_group=0,
                                preexec_fn=lambda: os.sched_setaffinity(0, CLIENT_CPUS))
        try:
            proc.wait(timeout=max(1.0, left()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            result["stopped_at_deadline"] = True
    result["bench_s"] = round(time.monotonic() - started, 1)
    trials = [json.loads(line) for line in steps_file.read_text().splitlines()] \
        if steps_file.is_file() else []
    # [offered req/s, achieved req/s, p99 ms, passed, client CPU share, s since bench start]
    result["trials"] = [[t["target_rate"], t["throughput"], t["p99"], t["passed"],
                         t["client_cpu_share"], t["t_s"]] for t in trials]
    done = WORK / f"bench-{name}" / "results.json"
    if proc.returncode == 0 and done.is_file():
        results = json.loads(done.read_text())
        search = results["search"]
        result["max_rate"] = search["max_rate"]
        if search.get("step") is not None:
            step = results["steps"][search["step"]]
            result.update(p99_ms=step["latency_ms"].get("p99"),
                          p50_ms=step["latency_ms"].get("p50"),
                          throughput=step["throughput"],
                          client_cpu_share=step["client_cpu_share"],
                          client_bound=step["client_bound"],
                          mean_batch=(step.get("server") or {}).get("mean_batch"))
    else:
        result["bench_rc"] = proc.returncode
        passing = [t for t in trials if t["passed"]]
        best = max(passing, key=lambda t: t["target_rate"], default=None)
        result["max_rate_lower_bound"] = best["target_rate"] if best else None
        if best:
            result.update(p99_ms=best["p99"], throughput=best["throughput"],
                          client_cpu_share=best["client_cpu_share"])
        tail = (WORK / f"bench-{name}.log").read_text(errors="replace").splitlines()[-5:]
        result["bench_log_tail"] = tail
    return result


def one_run(model: str, workers: int, connections: int, instances: int,
            figures: dict[str, Any]) -> None:
    name = (f"{model}-{workers}" + (f"-c{connections}" if connections != 4 else "")
            + (f"-i{instances}" if instances != len(SERVER_CPUS) else ""))
    run: dict[str, Any] = {"model": model, "workers": workers, "instances": instances,
                           "server_cores": len(SERVER_CPUS), "connections": connections}
    figures["runs"].append(run)
    if left() < MIN_RUN_S:
        run["skipped"] = f"{left():.0f} s left, under {MIN_RUN_S:.0f}"
        log(f"{name}: skipped ({run['skipped']})")
        return
    log(f"{name}: --workers {workers} on {len(SERVER_CPUS)} cores")
    repo = repository(model, instances)
    server_log = WORK / f"server-{name}.log"
    proc, url = start_server(repo, workers, server_log,
                             cuda_env() if model == "cuda" else None)
    try:
        ready_s = wait_ready(url, proc, server_log, timeout_s=min(90.0, max(1.0, left())))
        run["ready_s"] = round(ready_s, 1)
        run["idle_rss_mb"] = rss_mb(proc.pid)
        if model == "cuda":  # no process on the GPU: the sessions fell back to the CPU
            run["gpu_memory_ready"] = gpu_memory()
        previous = [r.get("max_rate") for r in figures["runs"]
                    if r["model"] == model and r.get("max_rate")]
        # Start the search where the last N of this model ended: fewer doublings.
        start = max(START[model], previous[-1]) if previous else START[model]
        run.update(bench(url, name, start, connections))
        run["peak_rss_mb"] = peak_rss_mb(proc.pid)
        if model == "cuda":
            run["gpu_memory_after"] = gpu_memory()
        run["server_alive_after"] = proc.poll() is None
    except Exception as exc:  # recorded, the next run goes on
        run["error"] = str(exc)
    finally:
        stop_server(proc)
        run["server_exit"] = proc.returncode
        text = server_log.read_text(errors="replace")
        with (OUT / "servers.log").open("a", encoding="utf-8") as f:
            f.write(f"===== {name}\n" + "\n".join(text.splitlines()[-30:]) + "\n")
        if (WORK / f"steps-{name}.jsonl").is_file():
            with (OUT / "steps.jsonl").open("a", encoding="utf-8") as f:
                for line in (WORK / f"steps-{name}.jsonl").read_text().splitlines():
                    f.write(json.dumps({"run": name, **json.loads(line)}) + "\n")
    rate = run.get("max_rate", f"{run.get('max_rate_lower_bound')} (lower bound: stopped)")
    log(f"{name}: max rate {rate} req/s, "
        f"p99 {run.get('p99_ms')} ms, peak RSS {run.get('peak_rss_mb')} MB, "
        f"bench {run.get('bench_s')} s{' ERROR ' + run['error'] if 'error' in run else ''}")
    write(figures)


def in_process(processes: int, figures: dict[str, Any]) -> None:
    """Queries/s of `processes` processes side by side on the server's cores, each one ONNX
    Runtime thread over the served model, summed: the ceiling the workers are judged against."""
    run: dict[str, Any] = {"model": "inproc", "processes": processes, "seconds": INPROC_S}
    figures["runs"].append(run)
    if left() < INPROC_S + 10:
        run["skipped"] = f"{left():.0f} s left"
        return
    from queryserve.optimize.candidates import rates_side_by_side

    folder = repository("embed", len(SERVER_CPUS)) / "embed"
    texts = [json.loads(line)["text"] for line in
             (HERE / "queries.jsonl").read_text().splitlines() if line][:512]
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, SERVER_CPUS)  # the processes inherit the server's cores
    try:
        each = rates_side_by_side(folder / "model.onnx", folder / "tokenizer.json", texts,
                                  processes, INPROC_S)
    finally:
        os.sched_setaffinity(0, mask)
    run["rate"] = round(sum(each), 1)
    run["each_min_max"] = [round(min(each), 1), round(max(each), 1)]
    log(f"inproc-{processes}: {run['rate']:,.1f} queries/s")
    write(figures)


def hard_pairs(figures: dict[str, Any]) -> None:
    """The served cross-encoder's decision on each hard pair, on this machine's processor."""
    run: dict[str, Any] = {"model": "hardpairs"}
    figures["runs"].append(run)
    source = HERE / "duplicates"
    folder = WORK / "repo-duplicates" / "duplicates"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.yaml", "tokenizer.json"):
        shutil.copy(source / name, folder / name)
    (folder / "model.onnx").write_bytes(lzma.decompress((source / "model.onnx.xz").read_bytes()))
    asked = json.loads((source / "hard_pairs.json").read_text())
    proc, url = start_server(folder.parent, 1, WORK / "server-hardpairs.log")
    try:
        wait_ready(url, proc, WORK / "server-hardpairs.log", timeout_s=min(60.0, left()))
        import urllib.request

        body = json.dumps({"pairs": [[left, right] for left, right, _ in asked["pairs"]]})
        request = urllib.request.Request(f"{url}/v1/duplicates", body.encode(),
                                         {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        results = answer["results"]
        run.update(variant=asked["variant"], threshold=answer["threshold"], pairs=[
            {"left": left, "right": right, "person": person,
             "probability": result["probability"], "duplicate": result["duplicate"]}
            for (left, right, person), result in zip(asked["pairs"], results, strict=True)])
        run["all_right"] = all(p["duplicate"] == p["person"] for p in run["pairs"])
    except Exception as exc:  # recorded, the next run goes on
        run["error"] = str(exc)
    finally:
        stop_server(proc)
    log(f"hardpairs: {json.dumps(run)}")
    write(figures)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures: dict[str, Any] = {
        "what": "queryserve serve --workers N --cores C --grpc off (pinned to the server cores); "
                "max rate at p99 <= 10 ms, one query per request, queryserve bench --find-max "
                "(open loop, CLI search: majority of 2-3 runs per probe, 5% bracket) pinned to "
                "the client cores; model named embed; instance_group.count = C (a worker runs "
                "C/N one-thread instances); fake = embed's model.yaml with backend fake",
        "cores": len(ALL_CPUS), "server_cpus": SERVER_CPUS, "client_cpus": CLIENT_CPUS,
        "plan": PLAN, "deadline_s": DEADLINE - T0,
        "step_seconds": {"duration": float(DURATION), "warmup": float(WARMUP),
                         "drain": float(DRAIN_S), "stats_timeout": float(STATS_TIMEOUT_S)},
        "machine": versions(), "runs": [],
    }
    log(f"cores {len(ALL_CPUS)}: server {SERVER_CPUS}, client {CLIENT_CPUS}; plan {PLAN}")
    log(json.dumps(figures["machine"]))
    write(figures)
    try:
        for item in PLAN.split():
            model, _, counts = item.partition(":")
            if model == "hardpairs":
                hard_pairs(figures)
                continue
            if model == "inproc":
                for n in counts.split(","):
                    in_process(int(n), figures)
                continue
            model, *options = model.split("-")
            connections = next((int(o[1:]) for o in options if o.startswith("c")), 4)
            instances = next((int(o[1:]) for o in options if o.startswith("i")),
                             1 if model == "cuda" else len(SERVER_CPUS))
            for n in counts.split(","):
                one_run(model, int(n), connections, instances, figures)
    finally:
        for proc in list(servers):
            stop_server(proc)
        write(figures)
        log("done")


if __name__ == "__main__":
    main()
