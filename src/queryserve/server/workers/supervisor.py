"""`queryserve serve --workers N`: N server processes behind one HTTP and one gRPC port, and the
supervisor that runs them.

One server process is one event loop, and on a many-core machine that loop, not the model, is
the ceiling (BENCHMARKS "Workers"). So the process the user started serves nothing: it starts N
full servers by spawning (not forking: ONNX Runtime and gRPC own threads that a fork would copy
half-made), each binding the same addresses with SO_REUSEPORT so the kernel spreads connections
over them, and each given 1/N of the cores, so instances x threads over all workers stay within
them. What clients see is one server (`peers.py` says how the workers agree).

The supervisor:
- reserves the ports first (a bound, never listening socket with SO_REUSEPORT), which resolves
  port 0, refuses a port another program holds, and keeps the port while a worker is replaced;
- forwards SIGTERM, SIGINT and SIGHUP as SIGTERM: every worker drains as one server does, and the
  supervisor exits 0 when all have exited 0; a worker takes a repeated SIGTERM as the same
  one (a signal to the process group reaches it twice), so a second signal to the supervisor
  is sent on as SIGKILL: they exit now;
- replaces a worker that dies, at once the first time and then after a back-off that doubles
  with each death in a row (a worker that served `STEADY_S` ends the row): a request that
  kills whichever worker takes it, sent again and again, costs a worker at most every
  `MAX_BACKOFF_S`, never a restart loop; five deaths in a row before serving and it gives up,
  stops the others and exits 1 (its models will not load);
- kills a serving worker whose event loop has not turned for `--worker-timeout` (its beat,
  `peers.Siblings.beat`) and replaces it: a stuck loop answers nobody, and the kernel goes on
  handing it a share of the new connections (gunicorn's `--timeout`, for the same reason);
- dies with its workers: each asks the kernel for SIGTERM if the supervisor goes first.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from queryserve.errors import QueryServeError, ServeError
from queryserve.repository import ModelRepository
from queryserve.server.access_log import open_log_file
from queryserve.server.run import ServeOptions, serve
from queryserve.server.workers.peers import Seat
from queryserve.server.workers.plan import WORKER_TIMEOUT_S

log = logging.getLogger("queryserve")

MAX_FAILED_STARTS = 5
"""Deaths in a row of one worker before it ever served: then the server gives up."""
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
STEADY_S = 60.0
"""Serving this long ends a worker's row of deaths: its next one is replaced at once."""
POLL_S = 0.2
FOLDER_PREFIX = "queryserve-"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass
class _Slot:
    """One worker's place: the process in it now, and how its last starts went."""

    worker: int
    process: BaseProcess | None = None
    failed_starts: int = 0
    """Deaths in a row before serving."""
    deaths: int = 0
    """Deaths in a row, served or not, none after serving `STEADY_S`: the back-off's step."""
    restart_at: float | None = None
    serving_since: float | None = None
    """When the process in it was first seen serving (on its byte of `serving`); None: not
    yet."""
    stuck: bool = False
    """Killed for a loop that stopped turning (`Supervisor._kill_stuck`)."""


class Supervisor:
    def __init__(self, options: ServeOptions, workers: int, log_level: str = "INFO",
                 worker_timeout_s: float = WORKER_TIMEOUT_S) -> None:
        self.options = options
        self.workers = workers
        self.log_level = log_level
        self.worker_timeout_s = worker_timeout_s
        self.context = multiprocessing.get_context("spawn")
        self.serving = self.context.RawArray("b", workers)
        self.restarts = self.context.RawArray("i", 1)
        self.connections = self.context.RawArray("i", workers)
        self.beats = self.context.RawArray("d", workers)
        self.slots = [_Slot(w) for w in range(workers)]
        self.stopping = False
        self.signals = 0
        self.exit_codes: dict[int, int] = {}

    def run(self) -> int:
        """Serve until a signal and every worker has drained; the process's exit status."""
        # A repository that is not one is the user's mistake: said once, here, rather than by
        # every worker at each of its five tries.
        ModelRepository(self.options.repository).names()
        access_log = self.options.access_log
        if access_log is not None and access_log != "-":  # likewise a log it cannot write
            open_log_file(access_log).close()
        try:
            _remove_orphaned_folders()
            folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        except OSError as exc:  # a read-only root with no /tmp mounted (a 24-line traceback)
            raise ServeError(f"--workers {self.workers} needs a writable temporary folder for "
                             f"its control sockets ($TMPDIR, or /tmp): {exc.strerror or exc}; "
                             "mount one there (an emptyDir, a tmpfs)") from None
        with contextlib.ExitStack() as held:
            held.callback(shutil.rmtree, folder, True)
            options = self._reserve_ports(held)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, self._on_signal)
            for slot in self.slots:
                self._start(slot, options, folder)
            return self._watch(options, folder)

    def _reserve_ports(self, held: contextlib.ExitStack) -> ServeOptions:
        """The options every worker gets: the ports reserved (port 0 made a real one) and
        1/N of the cores each."""
        options = self.options
        http: socket.socket = held.enter_context(_reserve(options.host, options.port))
        grpc = options.grpc
        if grpc is not None:
            grpc = (grpc[0], held.enter_context(_reserve(*grpc)).getsockname()[1])
        cores = options.cores or len(os.sched_getaffinity(0))  # >= workers (`serve` checks)
        return dataclasses.replace(options, port=http.getsockname()[1], grpc=grpc,
                                   cores=max(1, cores // self.workers))

    def _start(self, slot: _Slot, options: ServeOptions, folder: Path) -> None:
        seat = Seat(slot.worker, self.workers, folder, self.serving, self.restarts,
                    self.connections, self.beats)
        process = self.context.Process(
            target=_worker_main, name=f"queryserve-worker-{slot.worker}",
            args=(dataclasses.replace(options, seat=seat), self.log_level, os.getpid()))
        process.start()
        slot.process, slot.restart_at, slot.serving_since, slot.stuck = process, None, None, False
        log.info("worker %d started (pid %d)", slot.worker, process.pid)

    def _watch(self, options: ServeOptions, folder: Path) -> int:
        announced = False
        while True:
            running = {s.process.sentinel: s for s in self.slots
                       if s.process is not None and s.process.exitcode is None}
            if self.stopping and not running:
                break
            for sentinel in wait(list(running), timeout=POLL_S):
                self._ended(running[sentinel])  # type: ignore[index]  # sentinels are ints
            for slot in self.slots:
                if slot.serving_since is None and self.serving[slot.worker]:
                    slot.serving_since = time.monotonic()
            if not self.stopping:
                self._kill_stuck()
                self._restart_due(options, folder)
            if not announced and all(self.serving):
                announced = True
                grpc = f", grpc://{options.grpc[0]}:{options.grpc[1]}" if options.grpc else ""
                log.info("ready: %d workers serving http://%s:%d%s", self.workers,
                         options.host, options.port, grpc)
        failed = {w: code for w, code in self.exit_codes.items() if code != 0}
        if failed:
            log.error("stopped; workers exited with %s", failed)
            return 1
        log.info("stopped: every worker drained and exited 0")
        return 0

    def _ended(self, slot: _Slot) -> None:
        process = slot.process
        assert process is not None
        process.join()
        code = process.exitcode if process.exitcode is not None else 1
        served = slot.serving_since is not None or bool(self.serving[slot.worker])
        self.serving[slot.worker] = 0  # it may have died without saying so
        self.connections[slot.worker] = 0  # and its connections died with it
        if self.stopping:
            # The stop's SIGTERM reached a worker still importing, before it drains on it:
            # it had accepted nothing, and exits as cleanly as one process does (a server
            # stopped in its first second exited 1).
            self.exit_codes[slot.worker] = 0 if code == -signal.SIGTERM and not served \
                else code
            return
        slot.failed_starts = 0 if served else slot.failed_starts + 1
        steady = (slot.serving_since is not None
                  and time.monotonic() - slot.serving_since >= STEADY_S)
        slot.deaths = 1 if steady else slot.deaths + 1
        self.restarts[0] += 1
        if slot.failed_starts >= MAX_FAILED_STARTS:
            log.error("worker %d died %d times in a row before serving (exit %s): stopping "
                      "the server", slot.worker, slot.failed_starts, code)
            self.exit_codes[slot.worker] = code or 1
            self._stop_all()
            return
        # One death of a worker that served is replaced at once: the server is short of it.
        delay = 0.0 if served and slot.deaths == 1 else min(
            MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (slot.deaths - 1))
        how = "killed, stuck" if slot.stuck else f"died (exit {code})"
        row = f", {slot.deaths} deaths in a row" if slot.deaths > 1 else ""
        log.error("worker %d (pid %d) %s: replacing it in %.1f s (%d replaced so far%s)",
                  slot.worker, process.pid, how, delay, self.restarts[0], row)
        slot.restart_at = time.monotonic() + delay

    def _kill_stuck(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            process = slot.process
            if (process is None or process.exitcode is not None or slot.stuck
                    or not self.serving[slot.worker]):
                continue
            still_s = now - self.beats[slot.worker]
            if still_s > self.worker_timeout_s:
                log.error("worker %d (pid %d): its event loop has not turned for %.1f s "
                          "(--worker-timeout %g): killing it", slot.worker, process.pid,
                          still_s, self.worker_timeout_s)
                slot.stuck = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]

    def _restart_due(self, options: ServeOptions, folder: Path) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot, options, folder)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("%s: draining %d workers", signal.Signals(signum).name, self.workers)
            self._stop_all()
        else:
            log.warning("second signal: workers exit now")
            self._stop_all(signal.SIGKILL)

    def _stop_all(self, how: signal.Signals = signal.SIGTERM) -> None:
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None and slot.process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, how)  # type: ignore[arg-type]


def _remove_orphaned_folders() -> None:
    """Remove the control folders of supervisors that were killed (SIGKILL, a crash): one
    stopped any other way removes its own, and a killed one cannot. The folder is named for
    its supervisor's pid; while that pid lives (or was reused) the folder is left alone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).split("-", 1)[0]
        # A folder gone meanwhile (OSError) or another user's process (PermissionError: it
        # lives) is left; so is a folder not this user's.
        with contextlib.suppress(OSError):
            if pid.isdigit() and folder.is_dir() and folder.stat().st_uid == os.getuid():
                try:
                    os.kill(int(pid), 0)
                except ProcessLookupError:
                    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _reserve(host: str, port: int) -> Iterator[socket.socket]:
    """A socket bound to `host:port` with SO_REUSEPORT that never listens: the workers bind
    beside it, nobody else can take the port while they are replaced, and port 0 becomes a
    free port every worker uses. SO_REUSEPORT lets this user's listeners share a port
    silently, so a port something already listens on is refused here, as one server would."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = sock.getsockname()[1]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            if probe.connect_ex((host, bound)) == 0:
                raise ServeError(f"cannot listen on {host}:{bound}: another server listens "
                                 "there")
        # Nothing listens while another server's workers load, so the probe finds nobody
        # and two servers shared the port, the kernel splitting clients between them. A name
        # in Linux's abstract socket namespace is held while this process lives, however it
        # ends, and a second supervisor cannot take it.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:
            try:
                held.bind(f"\0queryserve-{host}:{bound}")
            except OSError:
                raise ServeError(f"cannot listen on {host}:{bound}: another queryserve server "
                                 "is starting or serving there") from None
            yield sock
    finally:
        sock.close()


def _worker_main(options: ServeOptions, log_level: str, supervisor: int) -> None:
    """A worker: one full server on its share of the cores, until its supervisor's SIGTERM."""
    seat = options.seat
    assert seat is not None
    _die_with(supervisor)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the supervisor forwards SIGTERM
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s "
                                                f"worker-{seat.worker} %(name)s: %(message)s")
    try:
        serve(options)
    except QueryServeError as exc:
        log.error("worker %d: %s", seat.worker, exc.message)
        raise SystemExit(1) from None


PR_SET_PDEATHSIG = 1


def _die_with(supervisor: int) -> None:
    """Ask Linux for SIGTERM when the supervisor dies (a SIGKILL it cannot forward): the
    worker drains and exits rather than serve on, orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the request was made
        raise SystemExit(1)
