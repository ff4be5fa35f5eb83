"""The server as every front end sees it, HTTP and gRPC alike: the repository, the request
limits, readiness and draining, access control, the other workers, and the figures the
metrics and statistics report.

No protocol lives here: the transports fill in what they own (`transport`, once listening), and
the front ends read the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

from queryserve.api import Inputs, decode_texts
from queryserve.errors import InvalidInput, NotFound, PayloadTooLarge, QueryServeError
from queryserve.model import AnyModel, Model
from queryserve.repository import VERSION, ModelRepository, shown
from queryserve.server.access_log import AccessLog
from queryserve.server.security import AccessControl, RequestIds
from queryserve.server.snapshot import (
    ModelFigures,
    Snapshot,
    TransportCounts,
    merged,
    process_families,
)
from queryserve.server.tracing import Tracing

T = TypeVar("T")
log = logging.getLogger("queryserve")


@dataclass(frozen=True, slots=True)
class Limits:
    max_items: int = 1024
    """Items in one request: the rows of its batch (a text, or a pair of texts for a pair
    model), as Triton's batch dimension counts them."""


class Connections(Protocol):
    """The transport's counts, as the metrics report them (`HttpServer` has them)."""

    @property
    def connections(self) -> int: ...

    @property
    def refused(self) -> int: ...

    @property
    def evicted(self) -> int: ...

    @property
    def unanswered(self) -> int:
        """Requests read and not yet answered, over every connection."""
        ...

    @property
    def rebalanced(self) -> int:
        """Connections closed after an answer to even out the workers."""
        ...

    @property
    def aged(self) -> int:
        """Connections closed after an answer at their age limit."""
        ...

    @property
    def rejections(self) -> Mapping[str, int]:
        """Refusals by reason (`queryserve.server.http.RejectionReason`), every reason present."""
        ...


class Siblings(Protocol):
    """The other workers of a `--workers N` server, as one worker reaches them
    (`queryserve.server.workers.Siblings`)."""

    @property
    def worker(self) -> int:
        """This worker's number, 0 to N - 1."""
        ...

    @property
    def restarts(self) -> int:
        """Workers the supervisor has replaced since the server started."""
        ...

    def all_serving(self) -> bool:
        """Every worker is listening, its models warm, and none is draining."""
        ...

    async def snapshots(self) -> list[Snapshot]:
        """Each sibling's own snapshot (those that answer: one being replaced does not)."""
        ...

    async def change(self, action: str, name: str,
                     here: Callable[[str], Awaitable[object]]) -> None:
        """`load` or `unload` model `name` in the whole server, in one order: here by
        `here(stamp)`, and in every sibling; an error names the worker."""
        ...


@dataclass
class ServerState:
    """The server as every front end sees it."""

    repository: ModelRepository
    limits: Limits = field(default_factory=Limits)
    transport: Connections | None = None
    """Set once the server listens."""
    loading: bool = True
    """Until the repository's first load is done."""
    draining: bool = False
    """From the first SIGTERM/SIGINT: readiness answers 503 while accepted work finishes."""
    strict_readiness: bool = True
    """Ready only while every model of the repository is loaded; False: once the first load
    is done, whatever failed or was unloaded since (Triton's `--strict-readiness false`)."""
    auth: AccessControl = field(default_factory=AccessControl)
    """API keys and the browser guard (Host, Origin, CORS), shared by HTTP and gRPC."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Served model names (`--served-model-name ALIAS=MODEL`): what clients may call a model,
    e.g. `text-embedding-3-small` for `embed`."""

    access_log: AccessLog | None = None
    """`--access-log`: a line per request, HTTP and gRPC alike."""
    tracing: Tracing | None = None
    """`--otlp-endpoint`: a span per request, HTTP and gRPC alike."""
    request_ids: RequestIds = field(default_factory=RequestIds)

    siblings: Siblings | None = None
    """With `--workers N`, the other workers: readiness, statistics and the repository's
    load and unload are the whole server's, whichever worker answers."""
    changes: set[asyncio.Future[object]] = field(default_factory=set)
    """Repository changes under way (`_to_the_end`)."""

    def ready(self) -> bool:
        return (not self.loading and not self.draining
                and (not self.strict_readiness or self.repository.ready())
                and (self.siblings is None or self.siblings.all_serving()))

    def snapshot_here(self) -> Snapshot:
        """This process's figures, the live objects themselves (read on this loop)."""
        transport = self.transport
        counts = None if transport is None else TransportCounts(
            transport.connections, transport.unanswered, dict(transport.rejections),
            transport.rebalanced, transport.aged)
        models = {name: ModelFigures(m.stats, m.queue_depth)
                  for name, m in self.repository.models.items()}
        worker = self.siblings.worker if self.siblings is not None else None
        return Snapshot(models, counts, self.auth.failures, self.auth.forbidden,
                        process_families(worker))

    async def snapshot(self) -> Snapshot:
        """The whole server's figures: this process's, with every worker's added."""
        here = self.snapshot_here()
        if self.siblings is None:
            return here
        return merged([here, *await self.siblings.snapshots()])

    async def load(self, name: str) -> None:
        """(Re)load a model here and in every sibling; answers when all have."""
        if self.siblings is None:
            await self._to_the_end("load", name, self.repository.load(name))
        else:
            await self._to_the_end("load", name, self.siblings.change(
                "load", name, lambda stamp: self.repository.load(name, stamp)))

    async def unload(self, name: str) -> None:
        if self.siblings is None:
            await self._to_the_end("unload", name, self.repository.unload(name))
        else:
            await self._to_the_end("unload", name, self.siblings.change(
                "unload", name, lambda _: self.repository.unload(name)))

    async def _to_the_end(self, action: str, name: str, change: Awaitable[object]) -> None:
        """`change` run to its end whatever its client does: a load whose client gave up (a
        timeout, a gRPC deadline) was cancelled with its request, after the build and before
        the swap, and with workers the others installed it: they served two versions until
        the next load, each READY. The client that leaves loses only the answer."""
        task = asyncio.ensure_future(change)
        self.changes.add(task)
        task.add_done_callback(self.changes.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            log.info("the client that asked to %s model '%s' left; the %s goes on", action,
                     shown(name), action)
            task.add_done_callback(partial(_said, action, name))
            raise

    # -- what every route asks of the server: one place each -------------------------------

    def model(self, name: str, version: str | None = None) -> AnyModel:
        """The model a client's `name` calls, on any route and protocol (`resolve`); a known
        model not loaded now is a 503."""
        model = self.repository.models.get(self.aliases.get(name, name))
        if model is not None and version in (None, "", VERSION):
            return model  # the hot path: one lookup
        return self.repository.get(self.resolve(name), version)

    def resolve(self, name: str) -> str:
        """The repository's name for what a client calls `name`: a model's own name or an
        alias (`--served-model-name`), which wins where a name is both. A name the server does
        not know is a 404 listing what it serves."""
        target = self.aliases.get(name, name)
        if target in self.repository.models or self.repository.exists(target):
            return target
        raise self.unknown_model(name)

    def unknown_model(self, name: str) -> NotFound:
        """The 404 for a name the server does not serve, listing the names it does."""
        return NotFound(f"unknown model '{shown(name)}'; this server has: "
                        f"{', '.join(self.served_models()) or 'no models'}")

    def served_models(self) -> dict[str, AnyModel]:
        """Every name a client may call a loaded model by, sorted: the models' own names and
        the aliases."""
        loaded = self.repository.models
        targets = {name: name for name in loaded} | self.aliases
        return {name: loaded[target] for name, target in sorted(targets.items())
                if target in loaded}

    def infer(self, model: Model[T], inputs: Inputs) -> Awaitable[T]:
        """`model.infer`, within the server's item limit: every route infers through here, so
        an over-limit request is the same 413 whichever route or protocol carried it. (Not a
        coroutine itself: the caller awaits the model's, one frame fewer per request.)"""
        count = len(inputs.token_ids) if inputs.token_ids is not None else len(inputs.texts)
        if count > self.limits.max_items:
            error = PayloadTooLarge(f"the request has {count} items; at most "
                                    f"{self.limits.max_items} are allowed per request "
                                    "(serve --max-items)")
            model.stats.record_request(error.outcome, 0.0)
            raise error
        return model.infer(inputs)

    @staticmethod
    @contextmanager
    def reading(model: AnyModel) -> Iterator[None]:
        """Around what a route reads of a request once it knows the model: a refusal there (a
        400, a 413) is counted on the model as `Model.infer` counts those it finds itself.
        Only those were: 2 of 6 bad requests to a model were in its `invalid` count."""
        try:
            yield
        except QueryServeError as exc:
            model.stats.record_request(exc.outcome, 0.0)
            raise

    @staticmethod
    def texts(raw: object, where: str) -> list[str]:
        """A request's list of texts: a non-empty list, each item non-empty UTF-8 text (their
        number is checked against the limit where they are inferred, `infer`)."""
        if not isinstance(raw, list):
            raise InvalidInput(f"'{where}' must be a list of strings")
        if not raw:
            raise InvalidInput(f"'{where}' is empty; send at least one")
        return decode_texts(raw, where)


def _said(action: str, name: str, change: asyncio.Future[object]) -> None:
    """How a change whose client left ended, in the log: nobody else hears of it."""
    if change.cancelled():
        return
    error = change.exception()
    if error is None:
        log.info("the %s of model '%s' its client left is done", action, shown(name))
    else:
        log.error("the %s of model '%s' its client left failed: %s", action, shown(name),
                  error.message if isinstance(error, QueryServeError) else error)
