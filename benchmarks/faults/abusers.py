"""The abusive clients of benchmarks/faults/abusive.py, each run to its end and reporting
what the server did to its connections and when: slowloris, a flood of silent connections, one
128 MB header line, a pipeliner that never reads, keep-alive connections that ask once and
idle at the cap, and a body in 2-byte chunks. All on 127.0.0.1, every wait bounded."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import select
import socket
import statistics
import threading
import time
from collections import Counter
from typing import Any

from faults.client import request_bytes
from faults.common import Server, kserve_body

PATH = "/v2/models/embed/infer"
SLOW_HEAD = request_bytes(PATH, b"{}")
LATE_S = 1.0  # how far past its deadline a close still counts as on time
FLOOD_S = 180.0  # the flood ends by then, whatever happens


def _spread(values: list[float]) -> dict[str, float] | None:
    """min / median / max, seconds."""
    if not values:
        return None
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


# -- slowloris: a head a byte at a time --------------------------------------------------------


async def slowloris(port: int, count: int, every_s: float, header_s: float) -> dict[str, Any]:
    gate = asyncio.Semaphore(200)

    async def one() -> tuple[float | None, bytes]:
        """When the server closed the connection (None: not within the limit), and what it
        said before."""
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 15)
            except (OSError, TimeoutError):
                return None, b"connect failed"
        opened, sent, answer = time.monotonic(), 0, b""
        try:
            while time.monotonic() - opened < header_s + 10:
                writer.write(SLOW_HEAD[sent:sent + 1])
                sent += 1
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), every_s)
                except TimeoutError:
                    continue
                if not chunk:
                    return time.monotonic() - opened, answer
                answer += chunk
        except OSError:
            return time.monotonic() - opened, answer
        finally:
            writer.close()
        return None, answer

    done = await asyncio.gather(*(one() for _ in range(count)))
    closed = [t for t, _ in done if t is not None]
    statuses = Counter(a.split(b" ", 2)[1].decode() if a.startswith(b"HTTP/1.1 ")
                       else a.decode() or "none" for _, a in done)
    return {"connections": count, "every_s": every_s, "closed": len(closed),
            "closed_after_s": _spread(closed), "answers": dict(statuses),
            "deadline_s": header_s, "on_time": sum(t <= header_s + LATE_S for t in closed)}


# -- a flood of connections that send nothing -------------------------------------------------


async def flood(server: Server, count: int, header_s: float) -> dict[str, Any]:
    gate, outcomes, errors = asyncio.Semaphore(256), Counter[str](), Counter[str]()
    refused_s: list[float] = []
    closed_s: list[float] = []
    held: list[asyncio.StreamWriter] = []
    probes: list[int] = []
    most_open = [0]

    async def one() -> None:
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", server.port), 15)
            except TimeoutError:
                errors["connect timed out"] += 1
                return
            except OSError as exc:
                errors[errno.errorcode.get(exc.errno or 0, str(exc))] += 1
                return
        opened = time.monotonic()
        held.append(writer)  # kept open on our side until the end: our descriptors stay used
        most_open[0] = max(most_open[0], len(held))
        try:
            data = await asyncio.wait_for(reader.read(4096), header_s + 10)
        except TimeoutError:
            outcomes["still open at the end"] += 1
            return
        except OSError:
            outcomes["reset"] += 1
            return
        after = time.monotonic() - opened
        if data.startswith(b"HTTP/1.1 503"):
            said = b"retry-after:" in data.lower()
            outcomes[f"503 {'with' if said else 'without'} Retry-After"] += 1
            refused_s.append(after)
        elif not data:
            outcomes["closed without an answer"] += 1
            closed_s.append(after)
        else:
            outcomes["answered " + data[:12].decode(errors="replace")] += 1

    async def probe(stop: asyncio.Event) -> None:
        """Readiness, every second, on a keep-alive connection opened before the flood."""
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        while not stop.is_set():
            writer.write(b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await asyncio.wait_for(reader.readexactly(length), 5)
                probes.append(int(head.split(b" ", 2)[1]))
            except (TimeoutError, OSError, asyncio.IncompleteReadError, IndexError):
                probes.append(0)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        writer.close()

    evicted_before = await asyncio.to_thread(
        server.metric, "queryserve_http_connections_evicted_total") or 0.0
    stop = asyncio.Event()
    prober = asyncio.ensure_future(probe(stop))
    try:  # each connection is bounded; this bounds them all should connects crawl
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), FLOOD_S)
    except TimeoutError:
        errors[f"unfinished after {FLOOD_S:.0f} s"] = count - sum(outcomes.values()) \
            - sum(errors.values())
    stop.set()
    await asyncio.wait_for(prober, 10)
    for writer in held:
        writer.close()
    evicted = (await asyncio.to_thread(
        server.metric, "queryserve_http_connections_evicted_total") or 0.0) - evicted_before
    return {"attempts": count, "most_open": most_open[0], "outcomes": dict(outcomes),
            "evicted": int(evicted),
            "connect_errors": dict(errors), "refused_after_s": _spread(refused_s),
            "closed_after_s": _spread(closed_s), "deadline_s": header_s,
            "closed_on_time": sum(t <= header_s + LATE_S for t in closed_s),
            "refused_on_time": sum(t <= LATE_S for t in refused_s),
            "probes": dict(Counter(str(p) for p in probes))}


# -- one 128 MB header line without a newline ---------------------------------------------------


def big_header(server: Server, total_mb: int = 128) -> dict[str, Any]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    seen: dict[str, Any] = {"answer": b""}
    started = time.monotonic()

    def read() -> None:
        try:
            while chunk := sock.recv(65536):
                seen.setdefault("answered_s", time.monotonic() - started)
                seen["answer"] += chunk
        except OSError as exc:
            seen["read_error"] = type(exc).__name__
        seen["closed_s"] = time.monotonic() - started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent, line = 0, memoryview(b"a" * 2**20)
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: 127.0.0.1\r\nx-long: ")
        while sent < total_mb * 2**20:
            sent += sock.send(line)
    except OSError as exc:
        seen["send_error"] = type(exc).__name__
    stopped = time.monotonic() - started
    reader.join(timeout=30)
    sock.close()
    answer: bytes = seen.pop("answer")
    return {**seen, "sent_mb": round(sent / 2**20, 2), "send_stopped_s": round(stopped, 3),
            "status": answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else None}


# -- a client that pipelines 20,000 requests and never reads ------------------------------------


def pipeliner(server: Server, count: int, read_s: float) -> dict[str, Any]:
    """`embed` requests: their answers (~8 KB each) outgrow the kernel's socket buffers (tens
    of MB on loopback) long before the 20,000th, so the server must hold the client back."""
    one = request_bytes(PATH, kserve_body(["wake me up at seven"]))
    data = memoryview(one * count)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=read_s + 30)
    progress: dict[str, Any] = {"sent": 0, "last_s": 0.0}
    started = time.monotonic()

    def send() -> None:
        try:
            while progress["sent"] < len(data):
                progress["sent"] += sock.send(data[progress["sent"]:progress["sent"] + 65536])
                progress["last_s"] = time.monotonic() - started
        except OSError as exc:
            progress["error"] = type(exc).__name__

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    poller = select.poll()  # the close, seen without reading: a reset or the server's FIN
    poller.register(sock, select.POLLRDHUP | select.POLLERR | select.POLLHUP)
    closed_s = None
    while time.monotonic() - started < read_s + 60 and closed_s is None:
        if poller.poll(50):
            closed_s = time.monotonic() - started
    sender.join(timeout=10)
    sock.close()
    return {"requests": count, "written": progress["sent"] // len(one),
            "last_byte_s": round(progress["last_s"], 3), "send_error": progress.get("error"),
            "closed_s": None if closed_s is None else round(closed_s, 3),
            "closed_after_last_byte_s": None if closed_s is None
            else round(closed_s - progress["last_s"], 3), "deadline_s": read_s}


# -- keep-alive connections that each asked once and then idle ----------------------------------

READY = b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"


async def _status(reader: asyncio.StreamReader) -> str:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await asyncio.wait_for(reader.readexactly(length), 10)
    return head.split(b" ", 2)[1].decode()


async def idle_flood(server: Server, count: int) -> dict[str, Any]:
    """`count` connections that each send one request, read its answer and then idle (a
    client pool held open, or a cheap attack on the cap); then a new connection every 0.25 s
    for 5 s, as a health probe or a new client comes: each must be answered 200."""
    gate, answers, errors = asyncio.Semaphore(256), Counter[str](), Counter[str]()
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one() -> None:
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", server.port), 15)
            except (TimeoutError, OSError) as exc:
                errors[type(exc).__name__] += 1
                return
            writer.write(READY)
            try:
                answers[await _status(reader)] += 1
            except (TimeoutError, OSError, asyncio.IncompleteReadError, IndexError):
                answers["no answer"] += 1
            held.append((reader, writer))

    evicted_before = await asyncio.to_thread(
        server.metric, "queryserve_http_connections_evicted_total") or 0.0
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), FLOOD_S)
    newcomers: Counter[str] = Counter()
    for _ in range(20):
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", server.port), 5)
            writer.write(READY)
            newcomers[await _status(reader)] += 1
            writer.close()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, IndexError) as exc:
            newcomers[type(exc).__name__] += 1
        await asyncio.sleep(0.25)
    closed = 0
    for reader, writer in held:
        with contextlib.suppress(TimeoutError, OSError):
            closed += await asyncio.wait_for(reader.read(1), 0.01) == b""
        writer.close()
    evicted = (await asyncio.to_thread(
        server.metric, "queryserve_http_connections_evicted_total") or 0.0) - evicted_before
    return {"connections": count, "answers": dict(answers), "connect_errors": dict(errors),
            "newcomers": dict(newcomers), "closed_by_server": closed, "evicted": int(evicted)}


# -- a body in 2-byte chunks -----------------------------------------------------------------------


def tiny_chunked_body(body_bytes: int = 8_000_000) -> tuple[bytes, bytes]:
    """A KServe request of about `body_bytes` (a text of that length), and its body chunked
    two bytes a chunk: the body limit's worth of content in millions of pieces. Made before
    the phase: joining 4 million pieces is 1-2 s of this process's CPU, which the server's
    other clients, on the same 2 cores, felt as the server's doing."""
    body = (b'{"inputs":[{"name":"text","shape":[1,1],"datatype":"BYTES","data":["'
            + b"a" * (body_bytes - 90) + b'"]}]}')
    if len(body) % 2:
        body += b" "
    return body, b"".join(b"2\r\n" + body[i:i + 2] + b"\r\n" for i in range(0, len(body), 2))


def tiny_chunks(server: Server, body: bytes, chunks: bytes) -> dict[str, Any]:
    """`tiny_chunked_body`'s request, sent."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
                     "application/json\r\ntransfer-encoding: chunked\r\n\r\n".encode()
                     + chunks + b"0\r\n\r\n")
        answer = sock.recv(64)
    return {"content_bytes": len(body), "wire_bytes": len(chunks),
            "status": answer.split(b" ", 2)[1].decode() if answer else "closed",
            "answered_s": round(time.monotonic() - started, 2)}
