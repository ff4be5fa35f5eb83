"""The model repository: a folder with one sub-folder per model, each holding `model.yaml`.

Finds models, loads them (config -> backends -> pipeline -> warmup) and unloads them, and says
which are ready. Each model has one version, "1". Loading is blocking work (sessions, warmup);
the server runs it off the event loop.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from queryserve.backends import create_backend
from queryserve.config import ModelConfig, load_model_config
from queryserve.errors import ConfigError, NotFound, QueryServeError, Unavailable
from queryserve.pipelines import Pipeline, create_pipeline
from queryserve.scheduling.stats import ModelStats

log = logging.getLogger(__name__)

VERSION = "1"


def available_cores() -> int:
    return len(os.sched_getaffinity(0))


def threads_per_instance(instances: int, cores: int) -> int:
    """Intra-op threads so that instances x threads never exceeds the cores given."""
    return max(1, cores // instances)


@dataclass
class Model:
    config: ModelConfig
    pipeline: Pipeline
    stats: ModelStats
    threads: int

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class ModelRepository:
    root: Path
    cores: int = field(default_factory=available_cores)
    models: dict[str, Model] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """Why a model that exists is not loaded (its load failed), for `/v2/repository/index`."""

    def names(self) -> list[str]:
        """Models present in the repository folder, loaded or not."""
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root} is not a folder")
        return sorted(p.parent.name for p in self.root.glob("*/model.yaml"))

    def load_all(self) -> None:
        """Load every model; a model that fails is reported and left out, the rest serve."""
        for name in self.names():
            try:
                self.load(name)
            except QueryServeError as exc:
                log.error("model '%s' not loaded: %s", name, exc.message)

    def load(self, name: str) -> Model:
        path = self.root / name / "model.yaml"
        if not path.is_file():
            raise NotFound(f"model '{name}' is not in the repository {self.root}")
        try:
            model = self._build(load_model_config(path))
        except QueryServeError as exc:
            self.errors[name] = exc.message
            raise
        self.errors.pop(name, None)
        # Swap, then retire the old one: a reload never leaves the model unavailable.
        previous = self.models.get(name)
        self.models[name] = model
        if previous is not None:
            previous.pipeline.scheduler.close()
        log.info("model '%s' ready: %d instance(s) x %d thread(s), backend %s", name,
                 model.config.instance_group.count, model.threads, model.config.backend)
        return model

    def _build(self, config: ModelConfig) -> Model:
        count = config.instance_group.count
        threads = threads_per_instance(count, self.cores)
        if count > self.cores:
            log.warning("model '%s': %d instances on %d cores oversubscribe the CPU",
                        config.name, count, self.cores)
        backends = [create_backend(config, threads) for _ in range(count)]
        stats = ModelStats()
        pipeline = create_pipeline(config, backends, stats)
        pipeline.warmup()
        return Model(config, pipeline, stats, threads)

    def unload(self, name: str) -> None:
        model = self.models.pop(name, None)
        if model is not None:
            model.pipeline.scheduler.close()

    def get(self, name: str, version: str | None = None) -> Model:
        if version not in (None, "", VERSION):
            raise NotFound(f"model '{name}' has no version '{version}'; it has version {VERSION}")
        model = self.models.get(name)
        if model is not None:
            return model
        if name in self.errors:
            raise Unavailable(f"model '{name}' is not loaded: {self.errors[name]}")
        if (self.root / name / "model.yaml").is_file():
            raise Unavailable(f"model '{name}' is not loaded; load it with "
                              f"POST /v2/repository/models/{name}/load")
        raise NotFound(f"unknown model '{name}'; this server has: "
                       f"{', '.join(sorted(self.models)) or 'no models'}")

    def index(self) -> list[dict[str, str]]:
        entries = []
        for name in self.names():
            entry = {"name": name, "version": VERSION,
                     "state": "READY" if name in self.models else "UNAVAILABLE"}
            if name in self.errors:
                entry["reason"] = self.errors[name]
            entries.append(entry)
        return entries

    def close(self) -> None:
        for name in list(self.models):
            self.unload(name)
