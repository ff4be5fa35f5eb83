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
            raise ConfigError(f"{config.path / 'model.yaml'}: model file {path} does not exist; "
                              "run `queryserve prepare` to build the default models")
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
        _check_output_widths(config, path, self.session)

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        feeds = {name: inputs[name] for name in self.input_names}
        values = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, values, strict=True))


def _check_output_widths(config: ModelConfig, path: Path,
                         session: ort.InferenceSession) -> None:
    """A declared output's width against the graph's: a classifier declared with 61 classes
    for a graph of 60 loaded, and every label was then another's (`label_48`...)."""
    declared = {spec.name: spec.dims for spec in config.outputs}
    for output in session.get_outputs():
        dims = declared.get(output.name)
        width = output.shape[-1] if output.shape else None
        if dims and isinstance(width, int) and dims[-1] not in (-1, width):
            raise ConfigError(f"{config.path / 'model.yaml'}: output '{output.name}' has dims "
                              f"{list(dims)}, but {path.name} gives {width} values an item")


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
