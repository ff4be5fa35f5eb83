"""How the workers of one server reach each other: a Unix socket per worker in the
supervisor's private folder, one request and one answer per connection.

What a worker asks its siblings for, and why it cannot just look:
- `snapshot`: their figures, so a scrape or a statistics request counts the whole server's work
  whichever worker the kernel handed it to;
- `change`: a repository load or unload, whichever worker a client asked, is run by one worker,
  the lowest-numbered that serves, one model's changes one at a time: each worker running its
  own first ran a load and an unload asked at once in opposite orders, and the workers were
  left split for good (one served the model, the other answered 503);
- `load` / `unload`: what that worker has every other do, answering when all have (or naming
  the one that failed), each load stamped alike;
- `models`: a replacement worker serves what its siblings serve now (and the same load of it,
  by its stamp), not what the folder held when the server started, and says what failed to
  load there as they do (it does not try it again).

Readiness needs no round trip: the supervisor shares one byte per worker (`Seat.serving`),
which a worker sets while it listens with warm models and clears when it drains, and the
supervisor clears when it dies. Nor does liveness: a serving worker writes the time into
`Seat.beats` every second from its event loop (`beat`), and the supervisor kills one whose
loop has not turned for `--worker-timeout` and replaces it.

Messages are pickled: both ends are this server's own processes, and the folder is the
supervisor's `mkdtemp` (mode 0700), so nobody else can connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queryserve import errors
from queryserve.errors import QueryServeError, ServeError, Unavailable
from queryserve.repository import STARTED, ChangeLocks
from queryserve.server.snapshot import Snapshot
from queryserve.server.state import ServerState

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
SNAPSHOT_TIMEOUT_S = 3.0
"""A sibling that has not answered a snapshot by then is left out of the scrape (and said):
under the scrape's own timeout (5 s in deploy/kubernetes), or a stuck sibling cost the whole
scrape (`up` 0, and the autoscaler's metric gone) rather than its part of the sums."""
LOAD_TIMEOUT_S = 600.0
"""Building a model takes seconds; minutes would mean a sibling is stuck."""
BEAT_S = 1.0
"""How often a serving worker says its event loop turns (`Seat.beats`)."""


@dataclass(frozen=True)
class Served:
    """What a sibling serves: each model with its load's stamp, and why the others failed."""

    stamps: dict[str, str]
    errors: dict[str, str]


@dataclass(frozen=True)
class Seat:
    """A worker's place in the server: its number, the others', and what they share."""

    worker: int
    workers: int
    folder: Path
    """The supervisor's private folder of control sockets."""
    serving: Any
    """One byte per worker, shared (`multiprocessing.RawArray('b')`): 1 while it serves."""
    restarts: Any
    """Replacements so far, shared (`multiprocessing.RawArray('i', 1)`)."""
    connections: Any
    """Each worker's open HTTP connections, shared (`multiprocessing.RawArray('i')`)."""
    beats: Any
    """When each worker's event loop last turned, shared (`multiprocessing.RawArray('d')`):
    `time.monotonic()`, one clock for every process of the machine."""

    def socket(self, worker: int) -> Path:
        return self.folder / f"worker-{worker}.sock"

    # The transport's `ConnectionShare`. The kernel hashes each new connection to one worker
    # for its life, and few connections spread unevenly: of 64, the busiest of 7 workers held
    # 1.3-1.6x the mean, of 14 workers 1.5-2.4x (BENCHMARKS.md), and the busiest worker's
    # queue sets the server's p99. So a worker over its share closes a connection after an
    # answer (`connection: close`, nothing else read on it); the client reconnects and is
    # hashed afresh. Over means a tenth over the mean, or one connection where that is less:
    # while closed connections' clients reconnect the total dips, and a worker holding its fair
    # share must not hand one back for that (with one connection of slack alone, 2 workers
    # closed 522-715 connections in a `bench --find-max` that opens 64 for each of its ~25
    # steps; with this, 35-47).

    def hold(self, connections: int) -> None:
        self.connections[self.worker] = connections

    def over(self, connections: int) -> bool:
        # The mean over the workers that serve: while one is replaced a client that
        # reconnects can only land here again, and dividing by all of them closed 75% of
        # the connections after one answer for the whole replacement.
        mean = sum(self.connections) / max(1, sum(self.serving))
        return bool(connections > mean + max(1.0, mean / 10))


class Siblings:
    """The other workers, as this one reaches them (`routing.Siblings`)."""

    def __init__(self, seat: Seat) -> None:
        self.seat = seat
        self.others = [w for w in range(seat.workers) if w != seat.worker]
        self._changes = ChangeLocks()  # when this worker runs the changes

    @property
    def worker(self) -> int:
        return self.seat.worker

    @property
    def restarts(self) -> int:
        return int(self.seat.restarts[0])

    def all_serving(self) -> bool:
        return all(self.seat.serving)

    def serve(self, serving: bool) -> None:
        """Say that this worker serves (listening, models warm), or no longer (draining)."""
        if serving:  # the supervisor watches the beats of serving workers only
            self.seat.beats[self.seat.worker] = time.monotonic()
        self.seat.serving[self.seat.worker] = int(serving)

    async def beat(self) -> None:
        """Say every `BEAT_S` that this worker's event loop turns, until cancelled: a loop
        stuck (a deadlock, a call that never returns, SIGSTOP) answers nobody, and its
        connections' clients would wait for good while readiness said 200."""
        while True:
            self.seat.beats[self.seat.worker] = time.monotonic()
            await asyncio.sleep(BEAT_S)

    async def snapshots(self) -> list[Snapshot]:
        answers = await asyncio.gather(*(self._ask(w, ("snapshot",), SNAPSHOT_TIMEOUT_S)
                                         for w in self.others), return_exceptions=True)
        found = []
        for worker, answer in zip(self.others, answers, strict=True):
            if isinstance(answer, Snapshot):
                found.append(answer)
            elif not isinstance(answer, _Absent):  # one being replaced is expected to be away
                log.warning("worker %d gave no figures: %s", worker, answer)
        return found

    async def change(self, action: str, name: str,
                     here: Callable[[str], Awaitable[object]]) -> None:
        runner = next((w for w in range(self.seat.workers) if self.seat.serving[w]),
                      self.worker)
        if runner != self.worker:
            try:
                answer = await self._ask(runner, ("change", action, name), LOAD_TIMEOUT_S)
            except _Absent:
                pass  # it died since: this worker runs the change
            except (asyncio.IncompleteReadError, ConnectionError):
                raise Unavailable(f"worker {runner} stopped before it could {action} "
                                  f"'{name}' (draining, or died); try again") from None
            else:
                if isinstance(answer, BaseException):
                    raise answer
                return
        async with self._changes.hold(name):
            stamp = os.urandom(8).hex()
            if action == "load":  # built everywhere at once
                await _together(here(stamp), self._everywhere(action, name, stamp))
            else:
                await here(stamp)
                await self._everywhere(action, name, stamp)

    async def _everywhere(self, action: str, name: str, stamp: str) -> None:
        answers = await asyncio.gather(*(self._ask(w, (action, name, stamp), LOAD_TIMEOUT_S)
                                         for w in self.others), return_exceptions=True)
        for worker, answer in zip(self.others, answers, strict=True):
            if isinstance(answer, _Absent):
                # Not started yet or being replaced: it loads what its siblings serve when it
                # starts (`models_served`), so it catches up.
                log.warning("worker %d is not running: it will %s '%s' when it starts from "
                            "what its siblings serve", worker, action, name)
            elif isinstance(answer, QueryServeError):
                raise _again(answer, worker)
            elif isinstance(answer, asyncio.IncompleteReadError | ConnectionError):
                # It closed the control connection without answering: it is draining (a
                # SIGTERM came during the load) or it died, and its replacement will load
                # what its siblings serve. Was a 500 naming asyncio's own error, then a 503
                # saying the server was shutting down when a worker had died.
                raise Unavailable(f"worker {worker} stopped before it could {action} "
                                  f"'{name}' (draining, or died: a replacement {action}s it "
                                  "from what the others serve); the others did")
            elif isinstance(answer, BaseException):
                raise ServeError(f"worker {worker} did not {action} '{name}': {answer}")

    async def models_served(self) -> Served | None:
        """What a running sibling serves now, or None when none answers (the server is
        starting: every worker loads the whole repository)."""
        for worker in self.others:
            with contextlib.suppress(_Absent, OSError, TimeoutError):
                answer = await self._ask(worker, ("models",), SNAPSHOT_TIMEOUT_S)
                if isinstance(answer, Served):
                    return answer
        return None

    async def _ask(self, worker: int, request: tuple[str, ...], timeout_s: float) -> object:
        try:
            reader, writer = await asyncio.open_unix_connection(self.seat.socket(worker))
        except (FileNotFoundError, ConnectionRefusedError):
            raise _Absent(worker) from None
        try:
            _send(writer, request)
            answer = await asyncio.wait_for(_receive(reader), timeout_s)
        finally:
            writer.close()
        return _unpacked(answer)


class _Absent(Exception):
    """No worker listens on that socket: not started yet, or dead and not yet replaced."""


async def answer_siblings(state: ServerState, seat: Seat) -> asyncio.AbstractServer:
    """Listen on this worker's control socket and answer its siblings' requests, on this
    worker's loop (the only thread that touches its models and figures)."""
    repository = state.repository

    async def change(action: str, name: str) -> None:
        await (state.load(name) if action == "load" else state.unload(name))

    async def load(name: str, stamp: str) -> None:
        await repository.load(name, stamp)  # the model itself stays here

    async def unload(name: str, stamp: str) -> None:
        await repository.unload(name)

    actions: dict[str, Callable[..., Awaitable[object]]] = {
        "snapshot": _sync(state.snapshot_here),
        "models": _sync(lambda: Served({name: repository.stamps.get(name, STARTED)
                                        for name in sorted(repository.models)},
                                       dict(repository.errors))),
        "change": change,
        "load": load,
        "unload": unload,
    }

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            action, *args = await _receive(reader)
            try:
                result: object = ("ok", await actions[action](*args))
            except QueryServeError as exc:
                result = ("error", type(exc).__name__, exc.message, exc.headers)
            except Exception:
                log.exception("error answering worker request %r", action)
                result = ("error", "QueryServeError", "internal server error", {})
            _send(writer, result)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the asking worker went away; it gets nothing
        except asyncio.CancelledError:
            pass  # this worker is stopping mid-request: the asker hears the connection close
        finally:
            writer.close()

    path = seat.socket(seat.worker)
    path.unlink(missing_ok=True)  # a worker this one replaces left its socket behind
    return await asyncio.start_unix_server(answer, path)


async def _together(*steps: Awaitable[object]) -> None:
    """Run the steps at once and wait for all, then raise the first failure: one worker's
    failed load must not leave the others' half done and unawaited."""
    outcomes = await asyncio.gather(*steps, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _sync(function: Callable[..., object]) -> Callable[..., Awaitable[object]]:
    async def call(*args: object) -> object:
        return function(*args)
    return call


def _send(writer: asyncio.StreamWriter, message: object) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(body)) + body)


async def _receive(reader: asyncio.StreamReader) -> Any:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))


def _unpacked(answer: tuple[Any, ...]) -> object:
    """A sibling's answer, or its error as the same class of `QueryServeError`, with its
    status and headers (built without the class's own `__init__`, whose arguments differ)."""
    if answer[0] == "ok":
        return answer[1]
    _, kind, message, headers = answer
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, QueryServeError)):
        cls = QueryServeError
    error = cls.__new__(cls)
    QueryServeError.__init__(error, message, headers)
    return error


def _again(error: QueryServeError, worker: int) -> QueryServeError:
    """`error` again, its message naming the worker it came from."""
    named = type(error).__new__(type(error))
    QueryServeError.__init__(named, f"worker {worker}: {error.message}", error.headers)
    return named
