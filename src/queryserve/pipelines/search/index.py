"""The vector index: each catalog item embedded once with the served encoder, kept on disk
(`queryserve.indexing` builds it; this module reads it for the search ensemble).

A folder per catalog (`songs/`, `products/`) holds `vectors.npy` (unit vectors, fp32: the exact
search, and what the ANN index is rebuilt from), `items.jsonl`, `ann.faiss` (an HNSW graph,
faiss, inner product: cosine on unit vectors) and `meta.json`, which names the encoder by a hash
of its model file: an index built with another encoder is rebuilt, because its vectors would not
be comparable with the queries'.

Exact search (a matrix product over every vector) is the reference; the ANN index answers
queries. HNSW's `efSearch` trades recall for time; BENCHMARKS.md has its recall@10 against
exact search on real queries. (faiss, not usearch: usearch 2.26's module, imported before
onnxruntime, made the onnxruntime import crash the process here.)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from queryserve.api import normalized
from queryserve.errors import ConfigError
from queryserve.pipelines.search.catalog import CATALOGS, Item
from queryserve.types import Array

ANN_FILE = "ann.faiss"
CONNECTIVITY = 32  # HNSW's M: links per node
# A graph built with a wider search (efConstruction 400, against 128) keeps its recall with a
# narrower search per query: on 1,000 held-out queries, recall@10 0.994 (songs) and 0.990
# (products) at efSearch 160, where the graph built at 128 needed efSearch 400 for 0.995 /
# 0.989, at about twice the time per query. The build takes about 25 s more, once, in prepare.
EXPANSION_ADD = 400  # efConstruction
EXPANSION_SEARCH = 160  # efSearch: recall@10 >= 0.98 on both catalogs (BENCHMARKS.md section 10)
HNSW = {"M": CONNECTIVITY, "efConstruction": EXPANSION_ADD}  # in meta.json: a change rebuilds


def encoder_fingerprint(encoder: Path) -> str:
    """The served encoder's identity: its model.yaml's model file, hashed."""
    from queryserve.config import load_model_config

    config = load_model_config(encoder / "model.yaml")
    model_file = encoder / config.parameter("model_file", "model.onnx")
    digest = hashlib.sha256()
    with model_file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


@dataclass
class CatalogIndex:
    catalog: str
    items: list[Item]
    vectors: Array
    ann: Any  # faiss.IndexHNSWFlat
    words: frozenset[str] = frozenset()  # of the items' texts, as the corrector reads them

    def search(self, query: Array, k: int) -> list[tuple[Item, float]]:
        """The ANN index's k nearest items by cosine, most similar first."""
        scores, rows = self.ann.search(query.reshape(1, -1).astype(np.float32), k)
        return [(self.items[int(row)], float(score))
                for row, score in zip(rows[0], scores[0], strict=True) if row >= 0]

    def exact(self, queries: Array, k: int) -> Array:
        """The reference: row indices of the k most similar items per query, by a full
        matrix product."""
        scores = queries @ self.vectors.T
        top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
        order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
        return np.take_along_axis(top, order, axis=1)

    def search_many(self, queries: Array, k: int) -> Array:
        """The ANN index's k nearest row indices per query (for recall against `exact`)."""
        rows: Array = self.ann.search(queries.astype(np.float32), k)[1]
        return rows


def foreign_words(indexes: Mapping[str, CatalogIndex]) -> dict[str, frozenset[str]]:
    """Each catalog's foreign words: those only the other catalogs use."""
    return {catalog: frozenset().union(*(other.words for name, other in indexes.items()
                                         if name != catalog)) - index.words
            for catalog, index in indexes.items()}


def load_faiss() -> Any:
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its INFO lines are noise
    import faiss

    # One thread: a search is one query on the event loop, and the model instances own the
    # cores; OpenMP threads would only contend with them.
    faiss.omp_set_num_threads(1)
    return faiss


def index_is_current(folder: Path, encoder: Path, catalogs: Sequence[str] = CATALOGS) -> bool:
    """Built for every catalog, with this encoder and this graph's parameters."""
    fingerprint = encoder_fingerprint(encoder)
    for catalog in catalogs:
        meta = folder / catalog / "meta.json"
        if not meta.is_file():
            return False
        built = json.loads(meta.read_text())
        if built["encoder"] != fingerprint or built.get("hnsw") != HNSW:
            return False
    return True


def load_index(folder: Path, catalog: str) -> CatalogIndex:
    out = folder / catalog
    if not (out / "meta.json").is_file():
        raise ConfigError(f"{out}: no vector index here; `queryserve prepare` builds it")
    items = []
    for line in (out / "items.jsonl").read_text(encoding="utf-8").splitlines():
        id_, title, who = json.loads(line)
        items.append(Item(id_, catalog, title, who))
    vectors = np.load(out / "vectors.npy")
    ann = load_faiss().read_index(str(out / ANN_FILE))
    ann.hnsw.efSearch = EXPANSION_SEARCH  # not kept in the file
    words = frozenset(w for item in items for w in normalized(item.text).split())
    return CatalogIndex(catalog, items, vectors, ann, words)
