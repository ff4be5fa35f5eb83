"""The search bar's pipeline: spell -> embed -> ANN -> results, with intent alongside.

Declared in the model repository as `search/pipeline.yaml`: which served models do each stage,
where the vector index is, and how many results by default. Each stage goes through the named
model's own pipeline and dynamic batcher, so concurrent searches share batches with every other
client of those models; intent runs while the corrected query is embedded and searched.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from queryserve.config import ModelConfig, TensorSpec
from queryserve.errors import ConfigError, InvalidInput, QueryTooLong
from queryserve.repository import ModelRepository
from queryserve.scheduling.stats import request_recorded
from queryserve.search.catalog import CATALOGS
from queryserve.search.index import CatalogIndex, load_index
from queryserve.spell.corrector import corrections

FILE = "pipeline.yaml"
MAX_K = 100
MODEL = "search"  # the KServe v2 name of the pipeline, as Triton names an ensemble


@dataclass(frozen=True)
class SearchConfig:
    path: Path
    spell: str | None
    embed: str
    intent: str | None
    index: Path
    k: int
    min_score: float
    """Auto-correct only at this spell score or above; below it the query is searched as typed
    and the correction is only offered ("did you mean")."""

    @classmethod
    def load(cls, folder: Path) -> SearchConfig:
        path = folder / FILE
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        allowed = ("spell", "embed", "intent", "index", "k", "min_score")
        unknown = sorted(set(raw) - set(allowed))
        if not isinstance(raw, dict) or unknown:
            raise ConfigError(f"{path}: unknown field '{unknown[0] if unknown else raw}'; "
                              f"allowed: {', '.join(allowed)}")
        k = raw.get("k", 10)
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ConfigError(f"{path}: field 'k' is {k!r}; expected an integer from 1 to "
                              f"{MAX_K}")
        min_score = raw.get("min_score", 0.5)
        if isinstance(min_score, bool) or not isinstance(min_score, int | float) \
                or not 0 <= min_score <= 1:
            raise ConfigError(f"{path}: field 'min_score' is {min_score!r}; expected a number "
                              "from 0 to 1")
        for field in ("spell", "embed", "intent", "index"):
            value = raw.get(field)
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigError(f"{path}: field '{field}' is {value!r}; expected a name")
        if not raw.get("embed"):
            raise ConfigError(f"{path}: missing required field 'embed' (the encoder model)")
        return cls(path, raw.get("spell"), raw["embed"], raw.get("intent"),
                   folder / raw.get("index", "index"), k, float(min_score))


class Searcher:
    def __init__(self, repository: ModelRepository, config: SearchConfig) -> None:
        self.repository = repository
        self.config = config
        self.indexes: dict[str, CatalogIndex] = {}
        # As a KServe v2 model: a query in; the corrected query, the intent and the results
        # (JSON text, one per query) out.
        self.model_config = ModelConfig(
            name=MODEL, path=config.path.parent, backend="ensemble", pipeline="search",
            max_batch_size=64, inputs=(TensorSpec("query", "BYTES", (1,)),),
            outputs=(TensorSpec("corrected", "BYTES", (1,)), TensorSpec("intent", "BYTES", (1,)),
                     TensorSpec("results", "BYTES", (1,))))

    def steps(self) -> list[str]:
        """The served models the pipeline runs, in order (Triton's ensemble steps)."""
        return [m for m in (self.config.spell, self.config.embed, self.config.intent) if m]

    def ready(self) -> bool:
        """Every step is loaded (one unloaded step fails every search)."""
        return all(step in self.repository.models for step in self.steps())

    def load(self) -> None:
        """Every catalog's index into memory (vectors and HNSW graph: about 80 MB)."""
        for catalog in CATALOGS:
            self.index(catalog)

    def index(self, catalog: str) -> CatalogIndex:
        if catalog not in self.indexes:
            self.indexes[catalog] = load_index(self.config.index, catalog)
        return self.indexes[catalog]

    async def search(self, query: str, k: int | None = None, catalog: str = "songs",
                     spell: bool = True) -> dict[str, Any]:
        """One search; `spell=False` searches the query as typed ("search instead for")."""
        if catalog not in CATALOGS:
            raise InvalidInput(f"'catalog' is {catalog!r}; expected one of "
                               f"{', '.join(CATALOGS)}")
        k = self.config.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidInput(f"'k' must be an integer from 1 to {MAX_K}, got {k!r}")
        if not isinstance(spell, bool):
            raise InvalidInput(f"'spell' must be true or false, got {spell!r}")
        timings: dict[str, float] = {}
        started = time.perf_counter()
        corrected, changed, score = query, False, 1.0
        if self.config.spell and spell:
            speller = self.repository.get(self.config.spell)
            try:
                with request_recorded(speller.stats):
                    rows = await speller.pipeline.infer([query])
            except QueryTooLong:
                pass  # longer than the corrector takes: searched as typed, not refused
            else:
                fixed = corrections([query], rows.output[:, 0], rows.extra.get("score"))[0]
                corrected, changed, score = fixed.corrected, fixed.changed, fixed.score
                timings["spell"] = _ms(started)
        searched = corrected if score >= self.config.min_score else query
        intent = (asyncio.ensure_future(self._intent(searched))
                  if self.config.intent else None)
        at = time.perf_counter()
        embed = self.repository.get(self.config.embed)
        with request_recorded(embed.stats):
            vector = await embed.pipeline.infer([searched])
        timings["embed"] = _ms(at)
        at = time.perf_counter()
        found = self.index(catalog).search(vector.output[0], k)
        timings["ann"] = _ms(at)
        label = None
        if intent is not None:
            label, timings["intent"] = await intent
        timings["total"] = _ms(started)
        return {"query": query, "corrected": corrected, "changed": changed,
                "spell_score": score, "searched": searched, "intent": label,
                "catalog": catalog,
                "results": [{**item.as_json(), "score": round(similarity, 4)}
                            for item, similarity in found],
                "timings_ms": {name: round(ms, 3) for name, ms in timings.items()}}

    async def _intent(self, text: str) -> tuple[dict[str, Any] | None, float]:
        started = time.perf_counter()
        assert self.config.intent is not None
        model = self.repository.get(self.config.intent)
        with request_recorded(model.stats):
            rows = await model.pipeline.infer([text])
        probabilities = rows.output[0]
        best = int(probabilities.argmax())
        names = model.config.labels(len(probabilities))
        return ({"intent": names[best], "score": round(float(probabilities[best]), 4)},
                _ms(started))


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
