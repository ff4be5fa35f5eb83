"""`queryserve bench` and `queryserve recommend` as a user runs them, against the real server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import (
    ROOT,
    RunningServer,
    free_port,
    start_server,
    stop_server,
    write_fake_model,
)


def queryserve(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queryserve", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_rate_sweep_reports_client_and_server_figures(real_server: RunningServer,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = queryserve("bench", real_server.url, "--rates", "20,40", "--duration", "1",
                     "--warmup", "0.3", "--price-per-hour", "0.36", "--out", str(out),
                     "--no-progress")
    assert run.returncode == 0, run.stderr
    results = json.loads((out / "results.json").read_text())
    steps = results["steps"]
    assert [s["target_rate"] for s in steps] == [20, 40]
    for step in steps:
        ok = step["by_status"]["200"]
        assert ok == step["target_rate"]  # every scheduled request answered
        assert 0.8 * step["target_rate"] <= step["throughput"] <= 1.2 * step["target_rate"]
        assert 0 < step["latency_ms"]["p50"] <= step["latency_ms"]["p99"]
        server = step["server"]  # read from the server's own /stats around the step
        # from the warmup's end: its 6-12 requests were counted too (the client's are not)
        assert ok - 2 <= server["requests"] <= ok + 2 and server["mean_batch"] >= 1
        assert server["compute_ms_per_request"] > 0
        # $0.36 an hour = $0.0001 a second, over `throughput` inferences a second
        expected = 0.36 / (step["inferences_per_s"] * 3600) * 1e6
        assert abs(step["cost_per_million"] - expected) < 1e-3
    for name in ("results.csv", "report.html", "latency_over_time.png",
                 "latency_vs_throughput.png", "batch_sizes.png"):
        assert (out / name).stat().st_size > 0, name
    assert "40 req/s" in run.stdout  # the summary table


def test_closed_loop_phases_over_the_binary_protocol(real_server: RunningServer,
                                                     tmp_path: Path) -> None:
    run = queryserve("bench", real_server.url, "--protocol", "kserve-binary",
                     "--items-per-request", "4", "--phase", "1:1", "--phase", "1:2:1",
                     "--warmup", "0.2", "--out", str(tmp_path), "--no-progress")
    assert run.returncode == 0, run.stderr
    steps = json.loads((tmp_path / "results.json").read_text())["steps"]
    assert [s["mode"] for s in steps] == ["closed", "closed"]
    assert steps[0]["users"] == 1 and steps[1]["users"] >= 2  # the second phase spawned users
    for step in steps:
        assert step["errors"] == 0 and set(step["by_status"]) == {"200"}
        assert step["inferences_per_s"] == 4 * step["throughput"]
        # read as the warmup ends, under load: a request or two may be half counted then
        assert abs(step["server"]["inferences"] - 4 * step["server"]["requests"]) <= 8


def test_find_max_on_the_openai_route(real_server: RunningServer, tmp_path: Path) -> None:
    run = queryserve("bench", real_server.url, "--protocol", "openai", "--find-max",
                     "--p99-ms", "1000", "--start-rate", "20", "--max-rate", "40",
                     "--duration", "0.5", "--warmup", "0.2", "--out", str(tmp_path),
                     "--no-progress")
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["url"].endswith("/v1/embeddings")
    search = results["search"]
    assert search["max_rate"] == 40  # a real model at 40 req/s is far under a 1 s p99
    assert results["steps"][search["step"]]["target_rate"] == 40
    # 40 is where the search stopped looking (it was reported as the server's maximum).
    assert search["capped"] is True
    assert "max rate with p99 <= 1000 ms: 40 req/s or more: the --max-rate ceiling" in run.stdout
    # No rate under the bar is a failed search (exit 0 before), its steps written.
    run = queryserve("bench", real_server.url, "--protocol", "openai", "--find-max",
                     "--p99-ms", "0.001", "--start-rate", "10", "--min-rate", "5",
                     "--duration", "0.3", "--warmup", "0", "--out", str(tmp_path / "none"),
                     "--no-progress")
    assert run.returncode == 1 and "no rate met p99 <= 0.001 ms" in run.stderr, run.stderr
    assert (tmp_path / "none" / "results.json").is_file()


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    run = queryserve("bench", nobody, "--rate", "10", "--duration", "0.5", "--out",
                     str(tmp_path))
    assert run.returncode == 1 and "cannot reach" in run.stderr
    assert "Traceback" not in run.stderr
    run = queryserve("bench", nobody, "--queries", str(tmp_path / "none.jsonl"))
    assert run.returncode == 1 and "does not exist" in run.stderr
    run = queryserve("bench", "http://example.com:80", "--rate", "10")
    assert run.returncode == 1 and "loopback" in run.stderr
    run = queryserve("bench", nobody, "--phase", "0:5")
    assert run.returncode == 2 and "users >= 1" in run.stderr
    run = queryserve("recommend", "--overheads", "none,four")
    assert run.returncode == 2 and "'four' is not a batch overhead" in run.stderr
    for flag, value, said in (("--rate", "inf", "'inf' must be a finite number > 0"),
                              ("--warmup", "nan", "'nan' must be a finite number >= 0"),
                              ("--connections", "0", "'0' must be >= 1")):
        run = queryserve("bench", nobody, flag, value)
        assert run.returncode == 2 and f"argument {flag}: {said}" in run.stderr, run.stderr
    for args, said in ((("--queries", str(tmp_path)), "cannot read queries file"),
                       (("--path", "/v1/{x}"), "the only placeholder it may hold is {model}")):
        run = queryserve("bench", nobody, "--rate", "10", *args)
        assert run.returncode == 1 and said in run.stderr and "Traceback" not in run.stderr
    run = queryserve("bench", "http://127.0.0.1:abc", "--rate", "10")
    assert run.returncode == 1 and "has no valid port" in run.stderr
    # An --out that cannot be made is refused before the run (a traceback after it).
    (tmp_path / "afile").write_text("")
    run = queryserve("bench", nobody, "--rate", "10", "--out", str(tmp_path / "afile" / "out"))
    assert run.returncode == 2 and "afile is a file" in run.stderr
    # Rates that cannot make a search: said before anything is reached (recommend started a
    # server, then failed with a traceback naming internal variables).
    for command in ("bench", "recommend"):
        run = queryserve(command, *((nobody,) if command == "bench" else ()),
                         "--start-rate", "100", "--max-rate", "50")
        assert run.returncode == 1 and "--start-rate 100 is above --max-rate 50" in run.stderr


def test_a_server_that_dies_mid_run_leaves_the_steps_measured(tmp_path: Path) -> None:
    """Regression: the server dying (or a Ctrl-C) after some steps lost every one of them:
    no results were written, minutes of --find-max included."""
    write_fake_model(tmp_path / "repository", "fast")
    server = start_server(tmp_path / "repository", tmp_path / "server.log")
    out = tmp_path / "out"
    bench = subprocess.Popen(
        [sys.executable, "-m", "queryserve", "bench", server.url, "--model", "fast",
         "--rates", "20,20,20,20,20,20", "--duration", "1", "--warmup", "0", "--out",
         str(out), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT)
    try:
        time.sleep(3.5)  # two or three steps in
        server.process.kill()
        _, stderr = bench.communicate(timeout=60)
    finally:
        bench.kill()
        stop_server(server)
    assert bench.returncode == 1 and "Traceback" not in stderr
    assert "the steps measured before are in" in stderr
    results = json.loads((out / "results.json").read_text())
    assert len([s for s in results["steps"] if s["by_status"].get("200")]) >= 2
    assert results["stop_reason"].startswith("ended early")


def test_a_run_the_server_refuses_is_refused_before_the_load(real_server: RunningServer,
                                                             tmp_path: Path) -> None:
    # A max-rate search is minutes of load: a wrong model must not cost them.
    started = time.monotonic()
    run = queryserve("bench", real_server.url, "--model", "nosuch", "--out", str(tmp_path),
                     "--no-progress")
    assert run.returncode == 1, run.stderr
    assert "refused the first request with 404" in run.stderr and "nosuch" in run.stderr
    assert "nothing was measured" in run.stderr and "Traceback" not in run.stderr
    assert time.monotonic() - started < 20 and not (tmp_path / "results.json").exists()
    run = queryserve("bench", real_server.url, "--protocol", "openai", "--model", "intent",
                     "--rate", "20", "--duration", "0.5", "--no-progress", "--out",
                     str(tmp_path))
    assert run.returncode == 1 and "refused the first request with 4" in run.stderr, run.stderr


def test_recommend_measures_points_writes_the_winner_and_resumes(tmp_path: Path) -> None:
    # The served variant is whichever int8 recipe timed faster in `queryserve prepare` on this
    # machine (the fused and plain ones are close), so the expected points are named after it.
    served = json.loads((ROOT / "model_repository" / "embed" / "prepare.json").read_text())
    chosen = served["chosen"]
    args = ("recommend", "--precisions", chosen, "--layouts", "1x1,2x1", "--workers", "1,2",
            "--max-batch-sizes", "64", "--delays-us", "0", "--overheads", "4",
            "--p99-ms", "1000",
            "--start-rate", "20", "--max-rate", "40", "--step-duration", "0.5",
            "--out", str(tmp_path), "--no-progress")
    run = queryserve(*args)
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "recommend.json").read_text())
    points = {p["id"]: p for p in results["points"]}
    # The two layouts asked for, two workers of one core each (one instance of one thread),
    # and the untuned reference: one instance on both cores, no batch cut (what the config
    # reader does without those keys).
    untuned = f"{chosen}/b64/d0/1x2"
    assert set(points) == {f"{chosen}/b64/d0/2x1/o4", f"{chosen}/b64/d0/1x1/o4",
                           f"{chosen}/b64/d0/1x1/o4/w2", untuned}
    assert all(p["max_rate"] == 40 and p["error"] is None for p in points.values())
    assert all(p["rss_mb"] and p["rss_mb"] > 50 for p in points.values())
    assert results["default"] == f"{chosen}/b64/d0/2x1/o4"
    assert results["untuned"] == untuned and points[untuned]["untuned"]
    assert "the untuned config" in run.stdout  # "...x the untuned config" or "it is the ..."
    assert sum(p["best"] for p in points.values()) == 1
    assert any(p["pareto"] for p in points.values())
    best_yaml = (tmp_path / "model.yaml").read_text()
    assert "max_batch_size: 64" in best_yaml and "queryserve recommend" in best_yaml
    # Every point ties at the 40 req/s cap, so the lowest p99 picks the winner: one of the two
    # asked for (batch cut 4) or the untuned reference (no cut). Its yaml keeps its knobs.
    (best,) = (p for p in points.values() if p["best"])
    assert ("batch_overhead_tokens: 4" in best_yaml) == (best["id"] != untuned)
    assert (tmp_path / "recommend.html").stat().st_size > 0
    # Run again: both points come from the saved state, no server is started.
    t0 = time.monotonic()
    again = queryserve(*args)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("measured in an earlier run") == 4
    assert time.monotonic() - t0 < 20


def test_recommend_with_no_point_served_exits_1(tmp_path: Path) -> None:
    """Regression: every point failed to load and recommend exited 0 (bench exits 1 when
    nothing was measured); each point also waited 180 s for its failed model."""
    served = json.loads((ROOT / "model_repository" / "embed" / "prepare.json").read_text())
    broken = tmp_path / "repository" / "embed"
    (broken / "variants").mkdir(parents=True)
    for entry in (ROOT / "model_repository" / "embed").rglob("*"):
        if entry.is_file():
            (broken / entry.relative_to(ROOT / "model_repository" / "embed")).symlink_to(entry)
    (broken / "model.onnx").unlink()
    (broken / "model.onnx").write_bytes(b"not a graph")  # the chosen variant, served
    run = queryserve("recommend", "--repository", str(tmp_path / "repository"), "--precisions",
                     served["chosen"], "--layouts", "1x1", "--workers", "1",
                     "--max-batch-sizes", "64", "--delays-us", "0", "--overheads", "4",
                     "--p99-ms", "1000", "--start-rate", "20", "--max-rate", "40",
                     "--step-duration", "0.5", "--out", str(tmp_path / "out"), "--no-progress",
                     timeout=120)
    assert run.returncode == 1, run.stderr
    assert "no configuration served a rate under the bar" in run.stderr
    assert "failed to load" in run.stdout + run.stderr



def test_a_run_nothing_succeeds_in_says_what_the_server_answered(tmp_path: Path) -> None:
    """Regression: it said only "20 x 500" and to check the URL, --model and --protocol,
    which were right; the server's own words say what is wrong."""
    write_fake_model(tmp_path / "repository", "broken", fail_on=101)  # [CLS]: every batch
    server = start_server(tmp_path / "repository", tmp_path / "server.log")
    try:
        run = queryserve("bench", server.url, "--model", "broken", "--rate", "20",
                         "--duration", "0.5", "--warmup", "0", "--out", str(tmp_path / "out"),
                         "--no-progress")
    finally:
        stop_server(server)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "no request succeeded" in run.stderr and "x 500" in run.stderr
    assert "the first request was answered 500: model 'broken' failed to run a batch" \
        in " ".join(run.stderr.split()), run.stderr
