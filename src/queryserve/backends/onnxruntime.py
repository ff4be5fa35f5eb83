"""ONNX Runtime: the CPU execution provider, or CUDA's when this onnxruntime build has it."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

from queryserve.config import ModelConfig
from queryserve.errors import ConfigError
from queryserve.types import Array

# ONNX Runtime's CPU kernel for SkipLayerNormalization (residual add + layer norm in one node)
# runs each row's statistics as a scalar loop with a division per element: under `perf` (1.32.0)
# it took 14.5% of the server's CPU at 1,000 req/s on the int8 MiniLM, nearly half as much as
# the int8 matrix products. Left as Add + LayerNormalization the same model ran 1.3-1.4x faster
# on one thread, in 1.31.1 and 1.32.0 alike (benchmarks/skip_layer_norm.py), so CPU sessions do
# not fuse them. A CUDA session keeps the fusion (its kernel was not profiled here).
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)

log = logging.getLogger(__name__)


class OnnxRuntimeBackend:
    def __init__(self, config: ModelConfig, threads: int) -> None:
        path = config.path / config.parameter("model_file", "model.onnx")
        if not path.is_file():
            raise ConfigError(f"{config.path / 'model.yaml'}: {_missing(path)}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning threads burn the cores that the event loop and the tokenizer need between
        # batches; on a few cores, yielding them is faster end to end.
        spin = "1" if config.parameter("allow_spinning", False) else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        self.session = (_cuda_session(config.name, path, options)
                        if "CUDAExecutionProvider" in ort.get_available_providers()
                        else _cpu_session(path, options))
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        self.providers = tuple(self.session.get_providers())
        _check_inputs(config, path, self.session)
        _check_outputs(config, path, self.session)

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        feeds = {name: inputs[name] for name in self.input_names}
        values = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, values, strict=True))


def _missing(path: Path) -> str:
    """Why the model file is not there, and what to do."""
    if path.is_dir():
        return f"parameters.model_file {path} is a folder; name the .onnx file in it"
    versions = sorted(v.relative_to(path.parent) for v in path.parent.glob(f"*/{path.name}")
                      if v.parent.name.isdigit())
    if versions:  # a Triton layout: 1/model.onnx
        return (f"model file {path} does not exist; queryserve serves one version from the "
                f"model's folder and reads no version folders: move {versions[-1]} beside "
                f"model.yaml, or set parameters.model_file: {versions[-1]}")
    return (f"model file {path} does not exist (`queryserve prepare` builds the default "
            "models' files)")


FED_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""What the text pipelines feed a graph: the tokenizer's ids, as int64."""
ONNX_DATATYPES = {"tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(double)": "FP64",
                  "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
                  "tensor(int64)": "INT64", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
                  "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(bool)": "BOOL",
                  "tensor(string)": "BYTES"}


def _check_inputs(config: ModelConfig, path: Path, session: ort.InferenceSession) -> None:
    """The graph takes what the pipelines feed: an export with inputs named otherwise (`ids`),
    int32 ids or an extra `position_ids` failed its first batch, and was refused as if its
    `max_sequence_length` were too long."""
    for graph_input in session.get_inputs():
        if graph_input.name not in FED_INPUTS or graph_input.type != "tensor(int64)":
            raise ConfigError(
                f"{config.path / 'model.yaml'}: {path.name} takes input '{graph_input.name}' "
                f"({graph_input.type}); queryserve feeds a graph {', '.join(FED_INPUTS[:-1])} "
                f"and (where it takes it) {FED_INPUTS[-1]}, each tensor(int64): export it "
                "with those inputs")


def _check_outputs(config: ModelConfig, path: Path, session: ort.InferenceSession) -> None:
    """A declared output against the graph's output of that name, as Triton checks them: its
    datatype (the graph's bytes were served under the declared one, FP32 read as INT32) and
    its dims, the batch's first (a classifier declared with 61 classes for a graph of 60
    loaded, and every label was another's; an export without pooling, [batch, tokens, 384],
    served each text padded to its batch-mates' length)."""
    declared = {spec.name: spec for spec in config.outputs}
    where = config.path / "model.yaml"
    for output in session.get_outputs():
        spec = declared.get(output.name)
        if spec is None:
            continue  # read by the pipeline (logits), not served as it is
        datatype = ONNX_DATATYPES.get(output.type, output.type)
        if datatype != spec.datatype:
            raise ConfigError(f"{where}: output '{output.name}' is declared {spec.datatype}, "
                              f"but {path.name} gives {datatype}")
        shape = list(output.shape or [])[1:]  # the graph's, less the batch dimension
        if output.shape is not None and len(shape) != len(spec.dims):
            raise ConfigError(
                f"{where}: output '{output.name}' has dims {list(spec.dims)}, but {path.name} "
                f"gives {len(shape)} dimension(s) an item ({shape}); a text encoder exported "
                "without its pooling gives one vector a token: export it with the pooling")
        for declared_dim, graph_dim in zip(spec.dims, shape, strict=False):
            if isinstance(graph_dim, int) and declared_dim not in (-1, graph_dim):
                raise ConfigError(
                    f"{where}: output '{output.name}' has dims {list(spec.dims)}, but "
                    f"{path.name} gives {shape} an item ({graph_dim} values, not {declared_dim})")


def _cpu_session(path: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=CPU_DISABLED_OPTIMIZERS)


def _cuda_session(name: str, path: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    """A session on CUDA. An onnxruntime-gpu build lists CUDA wherever it is installed, and where
    CUDA's libraries or the device are missing it logs an error and runs the session on the CPU
    with the graph fused for CUDA (slower there: see above). Such a session is made again for
    the CPU, and the fallback said in one line of ours."""
    session = ort.InferenceSession(str(path), options,
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    if "CUDAExecutionProvider" in session.get_providers():
        log.info("model '%s': a session on CUDA", name)
        return session
    log.warning("model '%s': this onnxruntime build has CUDA but could not start it here (its "
                "error above says why); running on the CPU", name)
    return _cpu_session(path, options)
