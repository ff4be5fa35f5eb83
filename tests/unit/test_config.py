from __future__ import annotations

from pathlib import Path

import pytest

from queryserve.config import load_model_config
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


def write(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "embed"
    folder.mkdir(exist_ok=True)
    path = folder / "model.yaml"
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
])
def test_bad_fields_name_the_file_field_value_and_what_is_allowed(
        tmp_path: Path, change: str, message: str) -> None:
    path = write(tmp_path, VALID + change + "\n")
    with pytest.raises(ConfigError) as error:
        load_model_config(path)
    assert str(path) in error.value.message and message in error.value.message


def test_missing_required_field(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: fake\nmax_batch_size: 4\n")
    with pytest.raises(ConfigError, match="missing required field 'input'"):
        load_model_config(path)


def test_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_model_config(write(tmp_path, "backend: [unclosed\n"))
