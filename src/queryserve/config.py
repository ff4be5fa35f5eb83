"""Model configuration: `model.yaml` -> frozen, validated settings.

Field names follow Triton's model configuration where Triton has the concept (`max_batch_size`,
`dynamic_batching`, `instance_group`, `response_cache`, `model_warmup`); queryserve's own additions
(`max_batch_tokens`, `batch_overhead_tokens`, `pipeline`, `parameters`) are documented here.
Validation happens once, at load: an unknown key or a bad value is a `ConfigError` naming the
file, the field, the value and what is allowed. Nothing here is mutated afterwards.

A folder of the repository holds a model (`model.yaml`) or the search ensemble
(`pipeline.yaml`: which served models are its steps), read by the same reader into the same
`ModelConfig`. Model names are checked here too: a name is a folder of the repository, never
a path out of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml

from queryserve.errors import ConfigError
from queryserve.types import NUMPY_DTYPES

ModelPipelineKind = Literal["text_embedding", "text_classification", "pair_scoring",
                            "text2text", "spelling"]
"""What a `model.yaml` may name as its `pipeline:` (`ModelConfig.pipeline` says what each does).
The one list of them: the reader, `pipelines.create_pipeline` and `model.ANSWERS` follow it."""
PipelineKind = Literal[ModelPipelineKind, "search"]
"""Every kind of served model: a model's pipeline, or the search ensemble (`pipeline.yaml`)."""
ModelBackendKind = Literal["onnxruntime", "ctranslate2", "noisy_channel", "fake"]
"""What a `model.yaml` may name as its `backend:` (`backends.create_backend` builds each)."""
BackendKind = Literal[ModelBackendKind, "ensemble"]
"""Every backend: a model's runtime, or `ensemble` (the search ensemble runs other models)."""
RUNS_ON: dict[ModelPipelineKind, tuple[ModelBackendKind, ...]] = {
    "text_embedding": ("onnxruntime", "fake"),
    "text_classification": ("onnxruntime", "fake"),
    "pair_scoring": ("onnxruntime", "fake"),
    "text2text": ("ctranslate2",),
    "spelling": ("noisy_channel",),
}
"""The backends each pipeline runs on: another pairing loaded, then failed every request."""
MORE_OUTPUTS: dict[ModelPipelineKind, tuple[str, ...]] = {"text2text": ("score",),
                                                         "spelling": ("score",)}
"""The outputs a pipeline gives beside its first (named as the model's folder likes): any
other declared loaded, and a request that asked for it was a 500."""
BACKENDS: tuple[ModelBackendKind, ...] = get_args(ModelBackendKind)
PIPELINES: tuple[ModelPipelineKind, ...] = get_args(ModelPipelineKind)
MODEL_FILE = "model.yaml"
ENSEMBLE_FILE = "pipeline.yaml"
LOOKALIKES = ("model.yml", "pipeline.yml", "config.pbtxt", "config.yaml", "model.json")
"""Files a model's folder may hold by mistake (another spelling, Triton's config): named
when a folder is not served for want of a model.yaml."""
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A model's name: its folder in the repository. No separators, no leading dot (so never `..`),
at most 128 characters (a name the file system would refuse never reaches it)."""
MAX_K = 100  # the most results a search may ask for

MAX_BATCH_OVERHEAD_TOKENS = 1_000_000  # `batch_overhead_tokens`' upper bound

PARAMETERS = ("model_file", "tokenizer_file", "max_sequence_length", "allow_spinning", "labels",
              "encoder", "threshold", "hints", "probabilities_output", "embedding_output",
              "max_words", "model_dir", "beam_size", "max_output_length", "intra_threads",
              "compute_type", "delay_ms", "fail_on_token_id")
"""The `parameters` the backends and pipelines read (`ModelConfig.parameter`): any other name
is refused as the other sections' unknown fields are (`max_sequence_lenght: 16` served 256
without a word). README's model repository table says what each does."""
T = TypeVar("T")
S = TypeVar("S", bound=str)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output. `dims` excludes the batch dimension, as in Triton; -1 is variable."""

    name: str
    datatype: str
    dims: tuple[int, ...]


SEARCH_OUTPUTS = (
    TensorSpec("corrected", "BYTES", (1,)), TensorSpec("intent", "BYTES", (1,)),
    TensorSpec("results", "BYTES", (1,)), TensorSpec("searched", "BYTES", (1,)),
    TensorSpec("spell_score", "FP32", (1,)), TensorSpec("intent_score", "FP32", (1,)),
    TensorSpec("intent_confident", "BOOL", (1,)), TensorSpec("skipped", "BYTES", (1,)))
"""The search ensemble's outputs, a row a query: what `/v1/search` answers, so that a KServe
client can tell "showing results for" (`searched` is the correction) from "did you mean" (it
is the query as typed), and an unsure intent from a sure one. A score the step did not give
(off, or skipped when it could not answer in time: `skipped`, comma-separated) is NaN."""


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    """Batch sizes cut at once when reachable; other batches wait up to the queue delay."""
    max_queue_delay_microseconds: int = 0
    """How long the oldest request may wait for a fuller batch; 0 runs whatever is queued."""
    max_queue_size: int = 1024
    """Items waiting beyond this are rejected at once with 503 + Retry-After; 0 is unbounded."""
    default_timeout_microseconds: int = 0
    """A queued item older than this fails with a timeout instead of running; 0 never."""
    max_batch_tokens: int = 16384
    """Token budget of one batch counting padding (items x longest item), as in TEI."""
    batch_overhead_tokens: int | None = None
    """What running one more batch costs, in padded tokens (a batch's fixed cost divided by
    one token's). When set, the length-sorted queue is cut into the batches of least total
    cost, batches x this + padded tokens: a lone long query no longer pads a batch of short
    ones. None: as few batches as the size and token limits allow."""


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    count: int = 1
    """Model instances, each running batches in its own thread with its own session."""


@dataclass(frozen=True, slots=True)
class ResponseCache:
    enable: bool = False
    max_entries: int = 65536
    """LRU capacity in items (one text, or pair of texts -> one cached output row)."""
    max_bytes: int = 64 * 1024 * 1024
    """LRU capacity in bytes, keys' text and rows counted (as Triton sizes its cache): a
    count alone let 65,536 keys of megabytes each be kept."""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    name: str
    batch_size: int
    text: str


@dataclass(frozen=True, slots=True)
class SearchSteps:
    """The search ensemble (`search/pipeline.yaml`): which served models do each step, where
    the vector index is, how many results by default."""

    embed: str
    spell: str | None = None
    intent: str | None = None
    index: Path = Path("index")
    k: int = 10
    min_score: float = 0.5
    """Auto-correct only at this spell score or above; below it the query is searched as typed
    and the correction is only offered ("did you mean")."""

    def models(self) -> tuple[str, ...]:
        """The served models the ensemble runs, in order (Triton's ensemble steps)."""
        return tuple(m for m in (self.spell, self.embed, self.intent) if m)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    path: Path
    backend: BackendKind
    pipeline: PipelineKind
    """`text_embedding` (texts -> vectors) or `text_classification` (texts, or a second input of
    pair texts -> probabilities), both in pipelines/text_embedding.py; or `pair_scoring` (text
    pairs -> the probability that they are one product: a bi-encoder and `head.npz`, in
    pipelines/pairs/scoring.py, or with `encoder: cross` a cross-encoder, in
    pipelines/pairs/cross.py); or `text2text` (texts ->
    generated texts, with the ctranslate2 backend), in pipelines/text2text.py; or `spelling`
    (queries -> corrected queries, with the noisy_channel backend), in pipelines/spelling.py."""
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dynamic_batching: DynamicBatching = DynamicBatching()
    instance_group: InstanceGroup = InstanceGroup()
    response_cache: ResponseCache = ResponseCache()
    model_warmup: tuple[WarmupSample, ...] = ()
    parameters: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    ensemble: SearchSteps | None = None
    """The search ensemble's steps (`backend: ensemble`, `pipeline: search`); None for a model."""

    def parameter(self, key: str, default: T) -> T:
        """A backend parameter, typed like its default (an integer where a number is meant);
        a value of another type is refused when the model loads, not replaced by the default
        without a word (`max_sequence_length: "abc"` served 256)."""
        value = self.parameters.get(key, default)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if isinstance(value, type(default)) and (isinstance(value, bool)
                                                 == isinstance(default, bool)):
            return value
        kind = {bool: "true or false", int: "an integer", float: "a number",
                str: "a string"}.get(type(default), type(default).__name__)
        raise ConfigError(f"{self.path / MODEL_FILE}: parameters.{key} is {value!r}; expected "
                          f"{kind}")

    def labels(self, count: int) -> list[str]:
        """A classifier's label names (`parameters.labels`, comma-separated, as `queryserve
        optimize` writes them), or `label_i` where it names none. Naming another number than
        the `count` outputs is refused: every label was `label_i` then, without a word."""
        names = [n.strip() for n in self.parameter("labels", "").split(",") if n.strip()]
        if names and len(names) != count:
            raise ConfigError(f"{self.path / MODEL_FILE}: parameters.labels names {len(names)} "
                              f"labels, and the model gives {count} values an item")
        return names or [f"label_{i}" for i in range(count)]


def is_model_name(name: str) -> bool:
    return MODEL_NAME.fullmatch(name) is not None


def load_config(folder: Path) -> ModelConfig:
    """The model or ensemble a repository folder holds."""
    if (folder / MODEL_FILE).is_file() and (folder / ENSEMBLE_FILE).is_file():
        raise ConfigError(f"{folder} holds both {MODEL_FILE} and {ENSEMBLE_FILE}: a folder is "
                          "one model or the search ensemble; move one to a folder of its own")
    if (folder / MODEL_FILE).is_file():
        return load_model_config(folder / MODEL_FILE)
    if (folder / ENSEMBLE_FILE).is_file():
        return load_ensemble_config(folder / ENSEMBLE_FILE)
    found = [near.name for near in sorted(folder.iterdir()) if near.name in LOOKALIKES] \
        if folder.is_dir() else []
    if found:  # a Triton repository, or another spelling: meant to be a model
        raise ConfigError(f"{folder} holds {', '.join(found)}, which queryserve does not read: "
                          f"a model's folder holds a {MODEL_FILE} (README, \"The model "
                          "repository\")")
    raise ConfigError(f"{folder} holds neither {MODEL_FILE} nor {ENSEMBLE_FILE}")


def load_model_config(path: Path) -> ModelConfig:
    """Read and validate one `model.yaml`; the model's name is its folder's name."""
    return _Reader(path).model(_read_yaml(path), default_name=path.parent.name)


def load_ensemble_config(path: Path) -> ModelConfig:
    """Read and validate the search ensemble's `pipeline.yaml`, as a KServe v2 model: a query
    in; the corrected query, its intent and the results (JSON text) out, a row per query."""
    return _Reader(path).ensemble(_read_yaml(path), name=path.parent.name)


class _Loader(yaml.SafeLoader):
    """`yaml.safe_load`, refusing a key repeated in a mapping: it keeps the last one, so
    `max_batch_size: 8` and, further down, `max_batch_size: 64` served 64 without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key '{key}' is repeated", key_node.start_mark)
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> object:
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # a SafeLoader
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    return raw if raw is not None else {}


class _Reader:
    """Walks a parsed YAML mapping, checking every field; errors name the file and field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, value: object, allowed: str) -> ConfigError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return ConfigError(f"{self.path}: field '{where}' is {shown}; expected {allowed}")

    def mapping(self, raw: object, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(where or "(top level)", raw, "a mapping")
        unknown = sorted(set(raw) - set(allowed), key=str)  # YAML keys need not be strings
        if unknown:
            key = f"{where}.{unknown[0]}" if where else str(unknown[0])
            raise ConfigError(
                f"{self.path}: unknown field '{key}'; allowed here: {', '.join(allowed)}"
            )
        return raw

    def integer(self, raw: object, where: str, low: int, high: int = 2**31) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
            raise self.fail(where, raw, f"an integer from {low} to {high}")
        return raw

    def choice(self, raw: object, where: str, allowed: tuple[S, ...]) -> S:
        if raw not in allowed:
            raise self.fail(where, raw, "one of " + ", ".join(allowed))
        return allowed[allowed.index(raw)]  # the allowed value itself, typed as one

    def text(self, raw: object, where: str) -> str:
        if not isinstance(raw, str) or not raw:
            raise self.fail(where, raw, "a non-empty string")
        return raw

    def flag(self, raw: object, where: str) -> bool:
        if not isinstance(raw, bool):
            raise self.fail(where, raw, "true or false")
        return raw

    def items(self, raw: object, where: str) -> list[Any]:
        if not isinstance(raw, list) or not raw:
            raise self.fail(where, raw, "a non-empty list")
        return raw

    def model(self, raw: object, default_name: str) -> ModelConfig:
        keys = ("name", "backend", "pipeline", "max_batch_size", "input", "output",
                "dynamic_batching", "instance_group", "response_cache", "model_warmup",
                "parameters")
        top = self.mapping(raw, "", keys)
        name = self.text(top.get("name", default_name), "name")
        if name != default_name:
            raise self.fail("name", name, f"the folder's name, {default_name!r}")
        for required in ("backend", "max_batch_size", "input", "output"):
            if required not in top:
                raise ConfigError(f"{self.path}: missing required field '{required}'")
        max_batch_size = self.integer(top["max_batch_size"], "max_batch_size", 1, 65536)
        backend = self.choice(top["backend"], "backend", BACKENDS)
        pipeline = self.choice(top.get("pipeline", "text_embedding"), "pipeline", PIPELINES)
        if backend not in RUNS_ON[pipeline]:
            raise self.fail("backend", backend, f"{' or '.join(RUNS_ON[pipeline])}: pipeline "
                                                f"'{pipeline}' runs on no other")
        # Every pipeline reads text, one text a row: an FP32 input loaded, then refused every
        # request, BYTES as not FP32 and FP32 as not a string; dims [-1] answered a request of
        # shape [1, 3] with three rows.
        inputs = self.tensors(top["input"], "input", ("BYTES",))
        for i, spec in enumerate(inputs):
            if spec.dims != (1,):
                raise self.fail(f"input[{i}].dims", list(spec.dims), "[1] (one text a row)")
        return ModelConfig(
            name=name,
            path=self.path.parent,
            backend=backend,
            pipeline=pipeline,
            max_batch_size=max_batch_size,
            inputs=inputs,
            outputs=self.outputs(top["output"], pipeline),
            dynamic_batching=self.batching(top.get("dynamic_batching", {}), max_batch_size),
            instance_group=self.instances(top.get("instance_group", {})),
            response_cache=self.cache(top.get("response_cache", {})),
            model_warmup=tuple(
                self.warmup(item, f"model_warmup[{i}]", max_batch_size)
                for i, item in enumerate(top.get("model_warmup") or [])
            ),
            parameters=self.parameters(top.get("parameters", {})),
        )

    def ensemble(self, raw: object, name: str) -> ModelConfig:
        fields = self.mapping(raw, "", tuple(SearchSteps.__dataclass_fields__))
        if "embed" not in fields:
            raise ConfigError(f"{self.path}: missing required field 'embed' (the encoder model)")
        steps = {step: self.model_name(fields[step], step)
                 for step in ("spell", "embed", "intent") if fields.get(step) is not None}
        for step, model in steps.items():
            if model == name:  # it would run itself (Triton: "circular dependency")
                raise self.fail(step, model, "another model's name, not this ensemble's")
        min_score = fields.get("min_score", 0.5)
        if isinstance(min_score, bool) or not isinstance(min_score, int | float) \
                or not 0 <= min_score <= 1:
            raise self.fail("min_score", min_score, "a number from 0 to 1")
        index = self.text(fields.get("index", "index"), "index")
        if not is_model_name(index):  # a folder beside pipeline.yaml, never a path out of it
            raise self.fail("index", index, "the name of a folder beside this file")
        query = TensorSpec("query", "BYTES", (1,))
        return ModelConfig(
            name=name, path=self.path.parent, backend="ensemble", pipeline="search",
            max_batch_size=64, inputs=(query,),
            outputs=SEARCH_OUTPUTS,
            ensemble=SearchSteps(
                embed=steps["embed"], spell=steps.get("spell"), intent=steps.get("intent"),
                index=self.path.parent / index,
                k=self.integer(fields.get("k", 10), "k", 1, MAX_K),
                min_score=float(min_score)))

    def model_name(self, raw: object, where: str) -> str:
        if not isinstance(raw, str) or not is_model_name(raw):
            raise self.fail(where, raw, "a model name (letters, digits, '.', '_', '-')")
        return raw

    def tensors(self, raw: object, where: str,
                datatypes: tuple[str, ...] = tuple(NUMPY_DTYPES)) -> tuple[TensorSpec, ...]:
        specs: list[TensorSpec] = []
        for i, item in enumerate(self.items(raw, where)):
            at = f"{where}[{i}]"
            fields = self.mapping(item, at, ("name", "datatype", "dims"))
            dims = self.items(fields.get("dims"), f"{at}.dims")
            spec = TensorSpec(
                name=self.text(fields.get("name"), f"{at}.name"),
                datatype=self.choice(fields.get("datatype"), f"{at}.datatype", datatypes),
                dims=tuple(self.integer(d, f"{at}.dims[{j}]", -1) for j, d in enumerate(dims)),
            )
            if any(other.name == spec.name for other in specs):
                raise self.fail(f"{at}.name", spec.name, f"a name no other {where} has")
            specs.append(spec)
        return tuple(specs)

    def outputs(self, raw: object, pipeline: ModelPipelineKind) -> tuple[TensorSpec, ...]:
        specs = self.tensors(raw, "output")
        more = MORE_OUTPUTS.get(pipeline, ())
        for i, spec in enumerate(specs[1:], 1):
            if spec.name not in more:
                allowed = (f"one of {', '.join(more)}" if more else
                           f"nothing: pipeline '{pipeline}' gives one output")
                raise self.fail(f"output[{i}].name", spec.name, allowed)
        return specs

    def batching(self, raw: object, max_batch_size: int) -> DynamicBatching:
        where = "dynamic_batching"
        fields = self.mapping(raw, where, tuple(DynamicBatching.__dataclass_fields__))
        default = DynamicBatching()
        sizes = fields.get("preferred_batch_size")
        preferred = tuple(
            self.integer(size, f"{where}.preferred_batch_size[{i}]", 1, max_batch_size)
            for i, size in enumerate(
                [] if sizes in (None, []) else self.items(sizes, f"{where}.preferred_batch_size"))
        )
        return DynamicBatching(
            preferred_batch_size=tuple(sorted(set(preferred))),
            max_queue_delay_microseconds=self.integer(
                fields.get("max_queue_delay_microseconds", default.max_queue_delay_microseconds),
                f"{where}.max_queue_delay_microseconds", 0, 10_000_000),
            max_queue_size=self.integer(
                fields.get("max_queue_size", default.max_queue_size),
                f"{where}.max_queue_size", 0),
            default_timeout_microseconds=self.integer(
                fields.get("default_timeout_microseconds", default.default_timeout_microseconds),
                f"{where}.default_timeout_microseconds", 0),
            max_batch_tokens=self.integer(
                fields.get("max_batch_tokens", default.max_batch_tokens),
                f"{where}.max_batch_tokens", 1),
            batch_overhead_tokens=None if fields.get("batch_overhead_tokens") is None
            else self.integer(fields["batch_overhead_tokens"],
                              f"{where}.batch_overhead_tokens", 0, MAX_BATCH_OVERHEAD_TOKENS),
        )

    def instances(self, raw: object) -> InstanceGroup:
        fields = self.mapping(raw, "instance_group", ("count",))
        return InstanceGroup(count=self.integer(fields.get("count", 1), "instance_group.count",
                                                1, 64))

    def cache(self, raw: object) -> ResponseCache:
        fields = self.mapping(raw, "response_cache", ("enable", "max_entries", "max_bytes"))
        return ResponseCache(
            enable=self.flag(fields.get("enable", False), "response_cache.enable"),
            max_entries=self.integer(fields.get("max_entries", ResponseCache().max_entries),
                                     "response_cache.max_entries", 1),
            max_bytes=self.integer(fields.get("max_bytes", ResponseCache().max_bytes),
                                   "response_cache.max_bytes", 1),
        )

    def warmup(self, raw: object, where: str, max_batch_size: int) -> WarmupSample:
        fields = self.mapping(raw, where, ("name", "batch_size", "text"))
        return WarmupSample(
            name=self.text(fields.get("name"), f"{where}.name"),
            batch_size=self.integer(fields.get("batch_size", 1), f"{where}.batch_size", 1,
                                    max_batch_size),
            text=self.text(fields.get("text"), f"{where}.text"),
        )

    def parameters(self, raw: object) -> dict[str, str | int | float | bool]:
        if not isinstance(raw, dict):
            raise self.fail("parameters", raw, "a mapping of names to scalars")
        self.mapping(raw, "parameters", PARAMETERS)
        for key, value in raw.items():
            if not isinstance(value, str | int | float | bool):
                raise self.fail(f"parameters.{key}", value, "a string, number or boolean")
        return dict(raw)
