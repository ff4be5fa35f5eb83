"""Building the search ensemble's vector index (`queryserve prepare`): every catalog item
embedded by the served encoder, in this process as the server runs it (`local.open_model`),
then an HNSW graph over the vectors. `pipelines/search/index.py` says what the folder holds
and reads it back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import TaskID

from queryserve.local import embed
from queryserve.pipelines.search.catalog import CATALOGS, load_items
from queryserve.pipelines.search.index import (
    ANN_FILE,
    CONNECTIVITY,
    EXPANSION_ADD,
    EXPANSION_SEARCH,
    HNSW,
    encoder_fingerprint,
    load_faiss,
)
from queryserve.progress import progress_bar
from queryserve.types import Array


def _new_ann(vectors: Array) -> Any:
    faiss = load_faiss()
    ann = faiss.IndexHNSWFlat(vectors.shape[1], CONNECTIVITY, faiss.METRIC_INNER_PRODUCT)
    ann.hnsw.efConstruction = EXPANSION_ADD
    ann.hnsw.efSearch = EXPANSION_SEARCH
    ann.add(vectors.astype(np.float32))
    return ann


def build_index(folder: Path, encoder: Path, data: Path, progress: bool = True,
                catalogs: Sequence[str] = CATALOGS) -> dict[str, object]:
    """Embed every catalog item with `encoder` and write the index under `folder`."""
    fingerprint = encoder_fingerprint(encoder)
    built: dict[str, object] = {"encoder": fingerprint}
    with progress_bar(progress) as display:
        for catalog in catalogs:
            items = load_items(data, catalog)
            task = display.add_task(f"embedding {catalog}", total=len(items), status="")

            def advance(n: int, task: TaskID = task) -> None:
                display.advance(task, n)

            vectors = embed(encoder, [item.text for item in items], on_rows=advance)
            ann = _new_ann(vectors)
            out = folder / catalog
            out.mkdir(parents=True, exist_ok=True)
            np.save(out / "vectors.npy", vectors)
            (out / "items.jsonl").write_text(
                "".join(json.dumps([i.id, i.title, i.performer_or_brand]) + "\n"
                        for i in items), encoding="utf-8")
            load_faiss().write_index(ann, str(out / ANN_FILE))
            # meta.json last: a folder without it is an unfinished build, rebuilt next time.
            (out / "meta.json").write_text(json.dumps(
                {"encoder": fingerprint, "items": len(items), "dims": int(vectors.shape[1]),
                 "hnsw": HNSW}))
            built[catalog] = len(items)
    return built
