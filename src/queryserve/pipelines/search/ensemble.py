"""The search ensemble: spell -> embed -> ANN -> results, with intent alongside.

Declared in the model repository as `search/pipeline.yaml` (`config.SearchSteps`): which served
models do each step, where the vector index is, how many results by default. Each step is a
call of the named model's own `infer`, so concurrent searches share batches with every other
client of those models; intent runs while the corrected query is embedded and searched.

Only `embed` is indispensable. A query the corrector does not take (too long), or a spell or
intent step that cannot answer now (its queue is full, it is unloading), leaves the search to
answer without that step, and the answer names the step in `skipped`: a search bar should
degrade, not fail, when an optional model is overloaded.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson

from queryserve.api import (
    Classifications,
    Corrections,
    Embeddings,
    Hit,
    Inputs,
    Label,
    SearchAnswer,
    Searches,
    as_json,
    flag_parameter,
    integer_parameter,
    normalized,
)
from queryserve.config import MAX_K, ModelConfig, SearchSteps
from queryserve.errors import (
    InvalidInput,
    NotFound,
    QueryServeError,
    QueryTooLong,
    Unavailable,
)
from queryserve.model import AnyModel
from queryserve.pipelines.search.catalog import CATALOGS
from queryserve.pipelines.search.index import CatalogIndex, foreign_words, load_index
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array

Lookup = Callable[[str], AnyModel]
"""The repository's `get`: a step's model as it is now, so a reloaded step is used at once."""


class SearchPipeline:
    queue_depth = 0  # the steps queue, on their own models

    def __init__(self, config: ModelConfig, lookup: Lookup, stats: ModelStats) -> None:
        assert config.ensemble is not None
        self.config = config
        self.stats = stats
        self.steps: SearchSteps = config.ensemble
        self.lookup = lookup
        self.indexes: dict[str, CatalogIndex] = {}
        # Each catalog's words that only the other catalogs use. One corrector serves every
        # catalog, and its language model learned all of them, so it may correct a products
        # query to a song's words ("levi's jeans" became the song "levii's jeans").
        self.foreign: dict[str, frozenset[str]] = {}

    def warmup(self) -> None:
        """Every catalog's index into memory (vectors and HNSW graph: about 80 MB); loaded on
        the first search instead, they would make that search slow."""
        for catalog in CATALOGS:
            self.indexes[catalog] = load_index(self.steps.index, catalog)
        self.foreign = foreign_words(self.indexes)

    def ready(self) -> bool:
        """Every step fits its place (`misfit`), and is loaded and ready. The fit first: a step
        that is an ensemble naming this one would ask it back, and on (readiness and the
        repository index were 500s, a 140 KB traceback each)."""
        if self.misfit() is not None:
            return False
        for name in self.steps.models():
            try:
                if not self.lookup(name).ready():
                    return False
            except QueryServeError:
                return False
        return True

    def misfit(self) -> str | None:
        """What in the steps cannot work: a model the repository does not have, a model of
        another kind than its step's (a spell step given an embedding model answered every
        search 400, as if the client's mistake), or vectors of another width than the index's
        (a 500 from the index on every search). Checked on each search too: a step may be
        reloaded as another model."""
        steps = (("spell", self.steps.spell, Corrections),
                 ("embed", self.steps.embed, Embeddings),
                 ("intent", self.steps.intent, Classifications))
        for step, name, kind in steps:
            if not name:
                continue
            try:
                model = self.lookup(name)
            except NotFound:  # a typo in pipeline.yaml: every search was a 404, the client's
                return (f"its '{step}' step names model '{name}', which the repository does "
                        "not have")
            except QueryServeError:
                continue  # not loaded: `ready` says so, and a search skips it or is a 503
            try:
                model.answering(kind, "the search ensemble")
            except InvalidInput as exc:
                return exc.message
            if kind is Embeddings and self.indexes:
                width = model.config.outputs[0].dims[-1]
                index = next(iter(self.indexes.values()))
                if width not in (-1, index.vectors.shape[1]):
                    return (f"model '{name}' gives vectors of {width} dimensions, and the "
                            f"index {index.vectors.shape[1]}: rebuild the index for it")
        return None

    def close(self) -> Awaitable[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)  # nothing queued here: the steps' queues drain on their models
        return done

    def abort(self) -> None:
        pass

    async def infer(self, inputs: Inputs) -> Searches:
        """One search per text; `parameters` may set `k`, `catalog` and `spell` (false: search
        the query as typed, "search instead for")."""
        k = integer_parameter(inputs, "k", self.steps.k, 1, MAX_K)
        catalog = inputs.parameters.get("catalog", CATALOGS[0])
        if catalog not in CATALOGS:
            raise InvalidInput(f"'catalog' is {as_json(catalog)}; expected one of "
                               f"{', '.join(CATALOGS)}")
        spell = flag_parameter(inputs, "spell", True)
        if (misfit := self.misfit()) is not None:
            raise Unavailable(f"model '{self.config.name}' cannot search: {misfit}")
        index = self.indexes[str(catalog)]
        started = time.perf_counter()
        answers = await asyncio.gather(*(self._search(q, k, index, spell, inputs.timeout_s)
                                         for q in inputs.texts))
        self.stats.record_ensemble(len(inputs.texts), time.perf_counter() - started)
        return Searches(list(answers))

    def tensors(self, result: Searches) -> dict[str, Array]:
        def column(values: list[str]) -> Array:
            array = np.empty((len(values), 1), dtype=object)
            array[:, 0] = values
            return array

        def numbers(values: list[float | None]) -> Array:
            return np.array([[math.nan if v is None else v] for v in values], dtype=np.float32)

        answers = result.answers
        return {"corrected": column([a.corrected for a in answers]),
                "intent": column([a.intent.name if a.intent else "" for a in answers]),
                "results": column([orjson.dumps(a.results).decode() for a in answers]),
                "searched": column([a.searched for a in answers]),
                "spell_score": numbers([a.spell_score for a in answers]),
                "intent_score": numbers([a.intent.score if a.intent else None
                                         for a in answers]),
                "intent_confident": np.array([[bool(a.intent and a.intent.confident)]
                                              for a in answers], dtype=np.bool_),
                "skipped": column([",".join(a.skipped) for a in answers])}

    async def _search(self, query: str, k: int, index: CatalogIndex, spell: bool,
                      timeout_s: float | None) -> SearchAnswer:
        timings: dict[str, float] = {}
        skipped: list[str] = []
        started = time.perf_counter()
        corrected, changed, score = query, False, None
        if self.steps.spell and spell:
            fixed = await self._optional(self.steps.spell, Corrections, query, timeout_s,
                                         skipped)
            if fixed is not None:
                first = fixed.corrections[0]
                corrected, changed, score = first.corrected, first.changed, first.score
                timings["spell"] = _ms(started)
        searched = corrected if self._applies(query, corrected, score, index) else query
        intent = (asyncio.ensure_future(self._intent(searched, timeout_s, skipped))
                  if self.steps.intent else None)
        try:
            at = time.perf_counter()
            embed = self.lookup(self.steps.embed).answering(Embeddings, "the search ensemble")
            vector = (await embed.infer(Inputs([searched], timeout_s=timeout_s))).vectors[0]
            timings["embed"] = _ms(at)
            at = time.perf_counter()
            found = index.search(vector, k)
            timings["ann"] = _ms(at)
        except BaseException:
            if intent is not None:  # the search failed: its intent is not worth running
                intent.cancel()
            raise
        label = None
        if intent is not None:
            label, timings["intent"] = await intent
            if label is None:
                del timings["intent"]
        timings["total"] = _ms(started)
        return SearchAnswer(
            query=query, corrected=corrected, changed=changed, spell_score=score,
            searched=searched, intent=label, catalog=index.catalog,
            results=[Hit(item.id, item.title, item.performer_or_brand, round(similarity, 4))
                     for item, similarity in found],
            timings_ms={name: round(ms, 3) for name, ms in timings.items()},
            skipped=skipped)

    def _applies(self, query: str, corrected: str, score: float | None,
                 index: CatalogIndex) -> bool:
        """Whether the search is for the correction rather than the query as typed: it is
        sure enough (`min_score`), and it brings no word that only another catalog uses.
        Otherwise it is only offered ("did you mean")."""
        if score is None or score < self.steps.min_score:
            return False
        brought = set(corrected.split()).difference(normalized(query).split())
        return brought.isdisjoint(self.foreign.get(index.catalog, ()))

    async def _intent(self, text: str, timeout_s: float | None,
                      skipped: list[str]) -> tuple[Label | None, float]:
        started = time.perf_counter()
        assert self.steps.intent is not None
        found = await self._optional(self.steps.intent, Classifications, text, timeout_s,
                                     skipped)
        if found is None:
            return None, 0.0
        best = found.top[0][0]
        # Under the model's calibrated threshold the intent is still answered, marked as not
        # confident: a page may dim it or leave it out, but must not assert it.
        return Label(best.name, round(best.score, 4), best.confident), _ms(started)

    async def _optional(self, name: str, kind: type[Any], text: str, timeout_s: float | None,
                        skipped: list[str]) -> Any:
        """A step the search can do without: None when it cannot answer now."""
        try:
            model = self.lookup(name).answering(kind, "the search ensemble")
            return await model.infer(Inputs([text], timeout_s=timeout_s))
        except (Unavailable, QueryTooLong):
            skipped.append(name)
            return None


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
