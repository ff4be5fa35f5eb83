"""The vector index: each catalog item embedded once with the served encoder, kept on disk.

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
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from queryserve.errors import ConfigError
from queryserve.pipelines.search.catalog import CATALOGS, Item, load_items
from queryserve.types import Array

EMBED_BATCH = 64
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


def embed_texts(encoder: Path, texts: Sequence[str],
                on_batch: Callable[[int], None] | None = None) -> Array:
    """The served encoder's vectors for `texts`, computed in this process by the same backend
    and tokenizer the server runs (length-sorted batches, so little padding)."""
    from queryserve.backends import create_backend
    from queryserve.config import load_model_config
    from queryserve.pipelines.base import load_tokenizer
    from queryserve.pipelines.text_embedding import pad_token_ids

    config = load_model_config(encoder / "model.yaml")
    tokenizer = load_tokenizer(config)
    backend = create_backend(config, os.cpu_count() or 1)
    # A pair_scoring model's first output is its probability; its encoder's is named apart.
    output = config.parameter("embedding_output", config.outputs[0].name)
    ids = [e.ids for e in tokenizer.encode_batch(list(texts))]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    vectors: Array | None = None
    for start in range(0, len(order), EMBED_BATCH):
        rows = order[start:start + EMBED_BATCH]
        inputs = pad_token_ids([ids[i] for i in rows])
        if "token_type_ids" in backend.input_names:
            inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
        batch = backend.run(inputs)[output]
        if vectors is None:
            vectors = np.zeros((len(ids), batch.shape[1]), dtype=np.float32)
        vectors[rows] = batch
        if on_batch:
            on_batch(len(rows))
    if vectors is None:
        return np.zeros((0, 0), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: Array = vectors / np.maximum(norms, 1e-12)
    return unit


@dataclass
class CatalogIndex:
    catalog: str
    items: list[Item]
    vectors: Array
    ann: Any  # faiss.IndexHNSWFlat

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


def _faiss() -> Any:
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its INFO lines are noise
    import faiss

    # One thread: a search is one query on the event loop, and the model instances own the
    # cores; OpenMP threads would only contend with them.
    faiss.omp_set_num_threads(1)
    return faiss


def _new_ann(vectors: Array) -> Any:
    faiss = _faiss()
    ann = faiss.IndexHNSWFlat(vectors.shape[1], CONNECTIVITY, faiss.METRIC_INNER_PRODUCT)
    ann.hnsw.efConstruction = EXPANSION_ADD
    ann.hnsw.efSearch = EXPANSION_SEARCH
    ann.add(vectors.astype(np.float32))
    return ann


def build_index(folder: Path, encoder: Path, data: Path, progress: bool = True,
                catalogs: Sequence[str] = CATALOGS) -> dict[str, object]:
    """Embed every catalog item with `encoder` and write the index under `folder`."""
    from rich.progress import TaskID

    from queryserve.progress import progress_bar

    fingerprint = encoder_fingerprint(encoder)
    built: dict[str, object] = {"encoder": fingerprint}
    with progress_bar(progress) as display:
        for catalog in catalogs:
            items = load_items(data, catalog)
            task = display.add_task(f"embedding {catalog}", total=len(items), status="")

            def advance(n: int, task: TaskID = task) -> None:
                display.advance(task, n)

            vectors = embed_texts(encoder, [item.text for item in items], advance)
            ann = _new_ann(vectors)
            out = folder / catalog
            out.mkdir(parents=True, exist_ok=True)
            np.save(out / "vectors.npy", vectors)
            (out / "items.jsonl").write_text(
                "".join(json.dumps([i.id, i.title, i.performer_or_brand]) + "\n"
                        for i in items), encoding="utf-8")
            _faiss().write_index(ann, str(out / ANN_FILE))
            # meta.json last: a folder without it is an unfinished build, rebuilt next time.
            (out / "meta.json").write_text(json.dumps(
                {"encoder": fingerprint, "items": len(items), "dims": int(vectors.shape[1]),
                 "hnsw": HNSW}))
            built[catalog] = len(items)
    return built


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
    ann = _faiss().read_index(str(out / ANN_FILE))
    ann.hnsw.efSearch = EXPANSION_SEARCH  # not kept in the file
    return CatalogIndex(catalog, items, vectors, ann)
