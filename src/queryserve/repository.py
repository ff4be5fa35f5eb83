"""The model repository: a folder with one sub-folder per model, each holding `model.yaml`, or
the search ensemble's `pipeline.yaml`.

Finds models, builds them (config -> backends -> pipeline -> warmup), swaps them in and retires
them, and says which are ready. Each model has one version, "1".

The lifecycle, as the server runs it:
- `load` builds the new model on a worker thread (sessions, warmup: seconds of blocking work)
  and swaps it in on the event loop, the only thread that touches the table of models and the
  schedulers. Requests that already hold the old model finish on it; new ones get the new one.
- The retired model closes: it takes no more work and runs its queue to the end, then its
  sessions are released and the cycle it forms with its scheduler is collected at once (after
  `gc.freeze()` the collector's full passes are rare, and each reload kept ~50 MB alive);
  `heap.trim` hands the freed pages back to the OS.
- `unload` retires the same way; later requests get a 503 (it exists, not loaded) with
  Retry-After.
A model name is a folder of the repository: `config.MODEL_NAME`, checked before any path is
made, so nothing outside the repository can be loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from queryserve import heap
from queryserve.backends import Backend, create_backend
from queryserve.config import (
    ENSEMBLE_FILE,
    LOOKALIKES,
    MODEL_FILE,
    ModelConfig,
    is_model_name,
    load_config,
)
from queryserve.errors import ConfigError, InvalidInput, NotFound, QueryServeError, Unavailable
from queryserve.model import AnyModel, Model
from queryserve.pipelines import create_pipeline
from queryserve.scheduling.stats import ModelStats

log = logging.getLogger(__name__)

STARTED = "started"
"""The stamp of a model loaded as the server started: the same in every worker."""

VERSION = "1"


def available_cores() -> int:
    return len(os.sched_getaffinity(0))


def threads_per_instance(instances: int, cores: int) -> int:
    """Intra-op threads so that instances x threads never exceeds the cores given."""
    return max(1, cores // instances)


def shown(name: str) -> str:
    """A client's model name as error messages quote it: never a page of it."""
    return name if len(name) <= 80 else name[:77] + "..."


class ChangeLocks:
    """A lock per model name, kept only while a change holds it or waits for it. Kept for
    good, every name a client asked to load or unload stayed, the unknown and malformed ones
    too: 100 gRPC unloads of 2 MB names took 250 MB for the server's life."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[asyncio.Lock, int]] = {}  # the lock, and its users

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock, users = self._held.get(name, (asyncio.Lock(), 0))
        self._held[name] = lock, users + 1
        try:
            async with lock:
                yield
        finally:
            lock, users = self._held[name]
            if users == 1:
                del self._held[name]
            else:
                self._held[name] = lock, users - 1

    def __len__(self) -> int:
        return len(self._held)


@dataclass
class ModelRepository:
    root: Path
    cores: int = field(default_factory=available_cores)
    models: dict[str, AnyModel] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """Why a model that exists is not loaded (its load failed), for `/v2/repository/index`."""
    retiring: set[asyncio.Future[None]] = field(default_factory=set)
    _changes: ChangeLocks = field(default_factory=ChangeLocks, repr=False)
    cap_instances: bool = False
    """Run at most `cores` instances of a model (a worker of `--workers N`, whose share of the
    cores may be smaller than a model's instance count: the workers together must not run
    more threads than there are cores)."""
    stamps: dict[str, str] = field(default_factory=dict)
    """Which load of each model serves: `STARTED`, or the stamp a server of `--workers N` gives
    one load in every worker, so that a replacement worker can tell a model reloaded while it
    started from the one it has (by name alone it kept the old one for good)."""
    builds: set[Future[AnyModel]] = field(default_factory=set, repr=False)
    """Builds running on the builder's threads. A signal does not stop one (sessions and
    warmup are blocking work): `serve` exits without waiting for it."""
    _builder: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="queryserve-build"),
        repr=False)

    def names(self) -> list[str]:
        """Models present in the repository folder, loaded or not: a folder with a model.yaml
        or a pipeline.yaml, or with a file meant as one (`LOOKALIKES`: Triton's config.pbtxt,
        model.yml), which fails to load and says why. Left out, a Triton repository served
        nothing and answered ready."""
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root} is not a folder")
        return sorted(p.name for p in self.root.iterdir()
                      if is_model_name(p.name) and _holds_a_model(p))

    def survey(self) -> list[str]:
        """`names`, once what a mistaken repository shows is said, before the server listens:
        a model's own folder given as the repository is refused; folders that are not served
        and an empty repository are warned of. Each of them served nothing and answered ready,
        with not a word in the log."""
        names = self.names()
        root = self.root
        if (root / MODEL_FILE).is_file() or (root / ENSEMBLE_FILE).is_file():
            raise ConfigError(f"{root} is a model's folder (it holds a "
                              f"{MODEL_FILE if (root / MODEL_FILE).is_file() else ENSEMBLE_FILE}"
                              "); --repository takes the folder that holds the models' "
                              f"folders, e.g. {root.parent}")
        for path in sorted(root.iterdir()):
            if path.name in names or path.name.startswith(".") or not path.is_dir():
                continue
            if not is_model_name(path.name):
                why = ("its name is not a model name (letters, digits, '.', '_' and '-', "
                       "starting with a letter or digit)")
            else:
                why = f"it has no {MODEL_FILE} (or {ENSEMBLE_FILE}, for an ensemble)"
            log.warning("model repository %s: %s/ is not served: %s", root, path.name, why)
        if not names:
            log.warning("model repository %s holds no model (a folder with a %s or %s): "
                        "serving none", root, MODEL_FILE, ENSEMBLE_FILE)
        return names

    def folder(self, name: str) -> Path:
        """The folder of model `name`; a name that is not one (`..`, a path, 5,000 characters)
        is the client's mistake, refused before any path is made from it."""
        if not is_model_name(name):
            raise InvalidInput(f"'{shown(name)}' is not a model name: letters, digits, '.', '_' "
                               "and '-', starting with a letter or digit, at most 128")
        return self.root / name

    def exists(self, name: str) -> bool:
        return _holds_a_model(self.folder(name))

    # -- loading --------------------------------------------------------------------------------

    def build(self, name: str) -> AnyModel:
        """The model, ready to serve: blocking work for a worker thread."""
        if not self.exists(name):
            # The repository's path is the operator's business, not a client's: not named.
            raise NotFound(f"model '{shown(name)}' is not in the repository (no folder of that "
                           "name with a model.yaml)")
        try:
            model = self.assemble(load_config(self.folder(name)))
        except QueryServeError as exc:
            exc.message = self._as_clients_read(exc.message)
            exc.args = (exc.message,)
            self.errors[name] = exc.message
            raise
        except Exception as exc:
            # Broken files fail inside the libraries that read them, each with errors of its
            # own (onnxruntime's InvalidProtobuf, tokenizers' Exception, a KeyError for an
            # output the graph lacks): one model's, said as such, not the server's. Uncaught,
            # one corrupt model.onnx stopped the whole server at start (and 500'd a load).
            message = self._as_clients_read(f"model '{name}' cannot be built from its "
                                            f"files: {type(exc).__name__}: {exc}")[:400]
            self.errors[name] = message
            raise ConfigError(message) from exc
        self.errors.pop(name, None)
        return model

    def _as_clients_read(self, message: str) -> str:
        """A model's load error as its load answer, the index and its 503s give it: paths
        within the repository (`embed/model.yaml`), without the repository's own place on
        disk, which is the operator's business (the log says it at start)."""
        roots = {str(self.root.resolve())}
        if str(self.root) not in (".", ""):
            roots.add(str(self.root))
        for root in sorted(roots, key=len, reverse=True):  # the absolute one holds the other
            message = message.replace(root + os.sep, "")
        return message

    def assemble(self, config: ModelConfig) -> AnyModel:
        """The model `config` describes, warmed up (also how `local.open_model` opens a folder
        in process)."""
        backends: list[Backend] = []  # an ensemble has none: its steps are other models
        threads = 0
        if config.ensemble is None:
            count = config.instance_group.count
            if self.cap_instances and count > self.cores:
                log.info("model '%s': %d instances configured, %d run on this worker's %d "
                         "core(s)", config.name, count, self.cores, self.cores)
                count = self.cores
                # What runs, so the ready line and the model's config say it too.
                config = replace(config, instance_group=replace(config.instance_group,
                                                                count=count))
            threads = threads_per_instance(count, self.cores)
            if count > self.cores:
                log.warning("model '%s': %d instances on %d cores oversubscribe the CPU",
                            config.name, count, self.cores)
            backends = [create_backend(config, threads) for _ in range(count)]
        stats = ModelStats()
        pipeline = create_pipeline(config, backends, stats, self.get)
        pipeline.warmup()
        return Model(config, pipeline, stats, threads)

    def install(self, model: AnyModel) -> None:
        """On the event loop: serve `model` from now on, and retire the one it replaces."""
        previous = self.models.get(model.name)
        self.models[model.name] = model
        steps = model.config.ensemble
        if steps is not None:  # it runs no instance of its own
            log.info("model '%s' ready: an ensemble of %s", model.name, ", ".join(steps.models()))
        else:
            log.info("model '%s' ready: %d instance(s) x %d thread(s), backend %s", model.name,
                     model.config.instance_group.count, model.threads, model.config.backend)
        if previous is not None:
            previous.replaced_by = model  # a request it can no longer queue goes there
            self._retire(previous)

    def _changing(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """One model's loads and unloads, one at a time in the order asked: an unload that
        came while a load was building was undone when the build was installed after it."""
        return self._changes.hold(name)

    async def load(self, name: str, stamp: str = STARTED) -> AnyModel:
        """(Re)load a model: built off the loop, swapped in on it; `stamp` names this load
        (`stamps`)."""
        self.folder(name)  # a bad name fails here, before a thread is used
        async with self._changing(name):
            build = self._builder.submit(self.build, name)
            self.builds.add(build)
            build.add_done_callback(self.builds.discard)
            model = await asyncio.wrap_future(build)
            self.install(model)
            self.stamps[name] = stamp
        return model

    async def load_all(self, names: Iterable[str] | None = None,
                       stamps: Mapping[str, str] | None = None) -> None:
        """Load every model (or those `names`, each stamped as `stamps` says); a model that
        fails is reported and left out, the rest serve."""
        for name in self.names() if names is None else names:
            try:
                await self.load(name, (stamps or {}).get(name, STARTED))
            except QueryServeError as exc:
                log.error("model '%s' not loaded: %s", name, exc.message)

    async def unload(self, name: str) -> None:
        """Take the model out of service; its queued work still runs to the end."""
        async with self._changing(name):
            self._take_out(name)
            self.stamps.pop(name, None)

    def _take_out(self, name: str) -> None:
        if not self.exists(name) and name not in self.models:
            raise NotFound(f"model '{shown(name)}' is not in the repository")
        model = self.models.pop(name, None)
        if model is not None:
            self._retire(model)

    def _retire(self, model: AnyModel) -> None:
        closed = asyncio.ensure_future(_released(model))
        self.retiring.add(closed)
        closed.add_done_callback(self.retiring.discard)

    def give_up(self) -> None:
        """At the drain's deadline: every model takes no more work and fails what it still
        holds, queued or running, each request answered 503 while its connection is open
        (closed at the deadline, the clients got no answer at all)."""
        for model in self.models.values():
            model.close()  # kept by the model, and awaited by `close` next
            model.abort()

    async def close(self, timeout_s: float | None = None) -> int:
        """Retire every model and wait until their queues have run (shutdown); past
        `timeout_s`, whatever still waits fails. The models given up on that way (a batch of
        theirs may still be running on its instance's thread)."""
        for name in list(self.models):
            self._take_out(name)
        self._builder.shutdown(wait=False)  # a build still running is not waited for
        if self.retiring:
            _, pending = await asyncio.wait(set(self.retiring), timeout=timeout_s)
            if pending:
                log.warning("%d model(s) still had work at the deadline: given up on",
                            len(pending))
                for release in pending:
                    release.cancel()  # _released aborts the model's queue
                await asyncio.wait(pending)
                return len(pending)
        return 0

    # -- lookup ---------------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> AnyModel:
        if version not in (None, "", VERSION):
            raise NotFound(f"model '{shown(name)}' has no version '{shown(str(version))}'; it has "
                           f"version {VERSION}")
        model = self.models.get(name)
        if model is not None:
            return model
        if name in self.errors:
            raise Unavailable(f"model '{name}' is not loaded: {self.errors[name]}")
        if self.exists(name):
            raise Unavailable(f"model '{name}' is not loaded; load it through the repository "
                              f"API (HTTP POST /v2/repository/models/{name}/load, gRPC "
                              "RepositoryModelLoad)")
        raise NotFound(f"unknown model '{shown(name)}'; this server has: "
                       f"{', '.join(sorted(self.models)) or 'no models'}")

    def ready(self) -> bool:
        """Every model of the repository is loaded and ready (the server's readiness)."""
        names = self.names()
        return all(n in self.models and self.models[n].ready() for n in names)

    def index(self) -> list[dict[str, str]]:
        """Every model of the repository, and any still served whose folder is gone (it
        serves until unloaded: the index must show it)."""
        entries = []
        for name in sorted(set(self.names()) | set(self.models)):
            model = self.models.get(name)
            entry = {"name": name, "version": VERSION,
                     "state": "READY" if model is not None and model.ready() else "UNAVAILABLE"}
            if name in self.errors:
                entry["reason"] = self.errors[name]
            elif model is not None and not model.ready():
                misfit = getattr(model.pipeline, "misfit", None)  # the search ensemble's
                entry["reason"] = (misfit and misfit()) or "a model it runs is not loaded"
            entries.append(entry)
        return entries


async def _released(model: Model[Any]) -> None:
    """Run the retired model's queue to the end, then give its memory back."""
    name = model.name
    try:  # shielded: a cancelled wait (the drain deadline) must not cancel the close itself
        await asyncio.shield(model.close())
    except asyncio.CancelledError:
        model.abort()
        raise
    del model
    # The requests it just answered still hold it until they resume: collect a moment later.
    asyncio.get_running_loop().call_later(RELEASE_DELAY_S, _collect)
    log.info("model '%s' retired: its queue has run", name)


RELEASE_DELAY_S = 1.0


def _collect() -> None:
    gc.collect()
    heap.trim()


def _holds_a_model(folder: Path) -> bool:
    """A model's folder, or one meant as one (`ModelRepository.names`)."""
    return any((folder / file).is_file() for file in (MODEL_FILE, ENSEMBLE_FILE, *LOOKALIKES))
