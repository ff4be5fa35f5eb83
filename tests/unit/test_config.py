from __future__ import annotations

from pathlib import Path

import pytest

from queryserve.config import (
    is_model_name,
    load_config,
    load_ensemble_config,
    load_model_config,
)
from queryserve.errors import ConfigError

VALID = """
backend: onnxruntime
max_batch_size: 32
input: [{name: text, datatype: BYTES, dims: [1]}]
output: [{name: embedding, datatype: FP32, dims: [384]}]
dynamic_batching:
  preferred_batch_size: [16, 8]
  max_queue_delay_microseconds: 500
instance_group: {count: 2}
response_cache: {enable: true}
model_warmup: [{name: w, batch_size: 4, text: hello}]
"""


def write(tmp_path: Path, text: str, file: str = "embed/model.yaml") -> Path:
    path = tmp_path / file
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_valid_config_is_read_with_triton_names(tmp_path: Path) -> None:
    config = load_model_config(write(tmp_path, VALID))
    assert config.name == "embed" and config.max_batch_size == 32
    assert config.dynamic_batching.preferred_batch_size == (8, 16)
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.dynamic_batching.max_queue_size == 1024  # default
    assert config.instance_group.count == 2 and config.response_cache.enable
    assert config.model_warmup[0].batch_size == 4
    assert config.inputs[0].dims == (1,)


def test_default_repository_config_is_valid() -> None:
    config = load_model_config(Path("model_repository/embed/model.yaml"))
    assert config.outputs[0].dims == (384,)
    assert config.dynamic_batching.batch_overhead_tokens == 4


@pytest.mark.parametrize(("change", "message"), [
    ("dynamic_batching: {max_queue_delay: 5}",
     "unknown field 'dynamic_batching.max_queue_delay'; allowed here: preferred_batch_size"),
    ("instance_group: {count: 0}", "field 'instance_group.count' is 0; expected an integer"),
    ("dynamic_batching: {preferred_batch_size: [64]}",
     "field 'dynamic_batching.preferred_batch_size[0]' is 64; expected an integer from 1 to 32"),
    ("response_cache: {enable: yes please}", "field 'response_cache.enable' is 'yes please'"),
    ("dynamic_batching: {batch_overhead_tokens: -1}",
     "field 'dynamic_batching.batch_overhead_tokens' is -1; expected an integer from 0"),
    ("colour: blue", "unknown field 'colour'"),
    ("backend: tensorflow",
     "field 'backend' is 'tensorflow'; expected one of onnxruntime, ctranslate2, "
     "noisy_channel, fake"),
    ("dynamic_batching: {preferred_batch_size: 4}",
     "field 'dynamic_batching.preferred_batch_size' is 4; expected a non-empty list"),
    ("output: [{name: e, datatype: FP32, dims: [4]}, {name: e, datatype: FP32, dims: [4]}]",
     "field 'output[1].name' is 'e'; expected a name no other output has"),
    ("output: [{name: e, datatype: FP32, dims: [4]}, {name: f, datatype: FP32, dims: [4]}]",
     "field 'output[1].name' is 'f'; expected nothing: pipeline 'text_embedding' gives one "
     "output"),
    ("pipeline: spelling", "field 'backend' is 'onnxruntime'; expected noisy_channel: pipeline "
                           "'spelling' runs on no other"),
])
def test_bad_fields_name_the_file_field_value_and_what_is_allowed(
        tmp_path: Path, change: str, message: str) -> None:
    key = change.split(":", 1)[0]
    lines = VALID.splitlines()
    kept = []  # VALID less the changed field's block: a repeated key is an error of its own
    for line in lines:
        if line.startswith(f"{key}:") or (line.startswith(" ") and kept and kept[-1] is None):
            kept.append(None)
        else:
            kept.append(line)
    path = write(tmp_path, "\n".join(line for line in kept if line is not None) + "\n"
                 + change + "\n")
    with pytest.raises(ConfigError) as error:
        load_model_config(path)
    assert str(path) in error.value.message and message in error.value.message


def test_a_repeated_key_is_refused_where_yaml_keeps_the_last(tmp_path: Path) -> None:
    """`max_batch_size: 8` and, further down, `max_batch_size: 64` served 64 without a word."""
    path = write(tmp_path, VALID + "max_batch_size: 64\n")
    with pytest.raises(ConfigError, match="the key 'max_batch_size' is repeated"):
        load_model_config(path)
    steps = write(tmp_path, "embed: embed\nk: 1\nk: 50\n", "search/pipeline.yaml")
    with pytest.raises(ConfigError, match="the key 'k' is repeated"):
        load_ensemble_config(steps)


def test_a_folder_with_a_model_and_an_ensemble_is_refused(tmp_path: Path) -> None:
    """It served model.yaml, and pipeline.yaml was left unread without a word."""
    write(tmp_path, VALID)
    write(tmp_path, "embed: embed\n", "embed/pipeline.yaml")
    with pytest.raises(ConfigError, match=r"holds both model\.yaml and pipeline\.yaml"):
        load_config(tmp_path / "embed")


def test_missing_required_field(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: fake\nmax_batch_size: 4\n")
    with pytest.raises(ConfigError, match="missing required field 'input'"):
        load_model_config(path)


def test_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_model_config(write(tmp_path, "backend: [unclosed\n"))


def write_ensemble(tmp_path: Path, text: str) -> Path:
    return write(tmp_path, text, "search/pipeline.yaml")


def test_the_search_ensemble_is_read_as_a_model(tmp_path: Path) -> None:
    config = load_ensemble_config(write_ensemble(
        tmp_path, "spell: spell\nembed: embed\nintent: intent\nk: 5\nmin_score: 0.7\n"))
    assert config.name == "search" and config.backend == "ensemble"
    assert [t.name for t in config.inputs] == ["query"]
    assert [t.name for t in config.outputs] == [
        "corrected", "intent", "results", "searched", "spell_score", "intent_score",
        "intent_confident", "skipped"]
    assert config.ensemble is not None
    assert config.ensemble.models() == ("spell", "embed", "intent")
    assert config.ensemble.k == 5 and config.ensemble.min_score == 0.7
    assert config.ensemble.index == tmp_path / "search" / "index"
    assert load_config(tmp_path / "search") == config


@pytest.mark.parametrize(("text", "message"), [
    ("spell: spell\n", "missing required field 'embed'"),
    ("embed: embed\nk: 0\n", "field 'k' is 0; expected an integer from 1 to 100"),
    ("embed: embed\nmin_score: high\n", "field 'min_score' is 'high'; expected a number"),
    ("embed: embed\nranker: x\n", "unknown field 'ranker'"),
    ("embed: ../embed\n", "field 'embed' is '../embed'; expected a model name"),
    ("embed: embed\nindex: /etc\n", "field 'index' is '/etc'; expected the name of a folder"),
    ("embed: [embed\n", "not valid YAML"),
    ("1: x\nembed: embed\n", "unknown field '1'"),
    ("- embed\n", "field '(top level)' is ['embed']; expected a mapping"),
])
def test_a_malformed_ensemble_is_one_line_naming_file_field_and_value(
        tmp_path: Path, text: str, message: str) -> None:
    path = write_ensemble(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_ensemble_config(path)
    assert message in error.value.message and str(path) in error.value.message
    assert "\n" not in error.value.message


@pytest.mark.parametrize(("name", "valid"), [
    ("embed", True), ("spell-seq2seq", True), ("a.b_c", True), ("9", True),
    ("..", False), (".hidden", False), ("a/b", False), ("", False), ("-x", False),
    ("m" * 128, True), ("m" * 129, False), ("é", False),
])
def test_model_names_are_folder_names_never_paths(name: str, valid: bool) -> None:
    assert is_model_name(name) is valid


def test_unknown_backend_or_pipeline_is_an_error_never_a_fake(tmp_path: Path) -> None:
    for field, value in (("backend", "torch"), ("pipeline", "ranking")):
        text = VALID.replace("backend: onnxruntime", "backend: onnxruntime\npipeline: "
                             "text_embedding") if field == "pipeline" else VALID
        text = text.replace(f"{field}: " + ("onnxruntime" if field == "backend"
                                           else "text_embedding"), f"{field}: {value}")
        with pytest.raises(ConfigError, match=f"field '{field}' is '{value}'; expected one of"):
            load_model_config(write(tmp_path, text))


def test_a_parameter_of_another_type_is_refused_not_replaced_by_its_default(
        tmp_path: Path) -> None:
    config = load_model_config(write(tmp_path, VALID + "parameters: {max_sequence_length: abc,"
                                     " threshold: 1, allow_spinning: 1, beam_size: true}\n"))
    assert config.parameter("threshold", 0.5) == 1.0  # an integer where a number is meant
    assert config.parameter("missing", 7) == 7
    for key, default in (("max_sequence_length", 256), ("allow_spinning", False),
                         ("beam_size", 1)):
        with pytest.raises(ConfigError, match=rf"model\.yaml: parameters\.{key} is"):
            config.parameter(key, default)


def test_a_parameter_no_backend_reads_is_refused(tmp_path: Path) -> None:
    """Regression: `max_sequence_lenght: 16` loaded, and served 256 without a word."""
    with pytest.raises(ConfigError, match=r"unknown field 'parameters\.max_sequence_lenght'; "
                                          r"allowed here: model_file, tokenizer_file, "
                                          r"max_sequence_length"):
        load_model_config(write(tmp_path, VALID + "parameters: {max_sequence_lenght: 16}\n"))
