"""Variant recipes: each turns an exported fp32 encoder into a faster graph.

Recipes kept (each passed the gate and won somewhere when they were explored; the rest are gone):
- `fp32-fused`: ONNX Runtime's transformer fusions (Attention, BiasGelu, EmbedLayerNormalization;
  not SkipLayerNormalization, whose CPU kernel is slow): faster than `fp32` for lone queries.
- `int8-smoothquant` (plain graph) and `int8-smoothquant-fused` (fused graph): SmoothQuant-style
  scaling calibrated on real text, then dynamic int8 with per-channel weights. The fused one is
  faster for lone queries, the plain one at batch 32, so both are timed. Plain dynamic int8 is
  about as fast but only just clears the gate on all-MiniLM-L6-v2 (min cosine 0.972 at batch
  32): a few activation channels carry outliers that wreck a per-tensor int8 scale, and moving
  part of that range into the weights, which are quantized per channel, removes most of the
  error (min cosine 0.99).
- `fp16-fused`: the fused graph in float16 with float32 inputs and outputs, for GPUs. It runs on
  the CPU too (slower than fp32 there), so its gate is checked on any machine.
bf16 has no recipe: ONNX Runtime's CPU provider has no bfloat16 MatMul kernel (a bf16 MatMul
graph fails to load with NOT_IMPLEMENTED), so nothing here could check or serve it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

Floats = npt.NDArray[np.float32]
Precision = Literal["fp32", "fp16", "int8", "bf16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8", "bf16")

# SmoothQuant's migration strength: 0.75 gave the best held-out parity when swept over
# 0.5..0.9 (0.5 is worse than no smoothing here; 0.9 pushes too much range into the weights).
SMOOTHING_ALPHA = 0.75
CALIBRATION_BATCH = 32
# Stored in each prepared encoder's prepare.json; `queryserve prepare` rebuilds an encoder built
# by another version. 2: residual adds left unfused (see `fuse_transformer_ops`).
RECIPES_VERSION = 2


@dataclass(frozen=True)
class BuildInputs:
    """What a recipe may need besides its base graph: calibration batches, already tokenized
    and padded as the server pads them."""

    calibration_feeds: Sequence[dict[str, npt.NDArray[np.int64]]]


@dataclass(frozen=True)
class Recipe:
    name: str
    precision: Precision
    base: str  # the variant it is built from
    description: str
    build: Callable[[Path, Path, BuildInputs], None]


def fuse_transformer_ops(src: Path, dst: Path, inputs: BuildInputs | None = None) -> None:
    """ONNX Runtime's BERT fusions; Python-level only (opt_level 0) so the file stays portable:
    the session applies its own hardware-specific optimisations when it loads the model.
    The "bert" fusions cover BERT, RoBERTa and DistilBERT; a pattern they do not recognise
    (MPNet's relative attention) is left unfused, and the gate checks the result either way.

    Residual adds stay Add + LayerNormalization rather than SkipLayerNormalization: see
    `CPU_DISABLED_OPTIMIZERS` for why (a GPU session fuses them itself)."""
    import onnx
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    meta = {p.key: p.value for p in onnx.load(str(src), load_external_data=False).metadata_props}
    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    fused = optimizer.optimize_model(
        str(src), model_type="bert", num_heads=int(meta["num_attention_heads"]),
        hidden_size=int(meta["hidden_size"]), opt_level=0, use_gpu=False,
        optimization_options=options,
    )
    stats = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    log.info("fused operators: %s", stats)
    fused.save_model_to_file(str(dst))


def convert_fp16(src: Path, dst: Path, inputs: BuildInputs | None = None) -> None:
    """Float16 weights and activations with float32 inputs and outputs (the server's contract)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))


def quantize_int8_smoothed(src: Path, dst: Path, inputs: BuildInputs) -> None:
    """Dynamic per-channel int8 after SmoothQuant-style scaling calibrated on `inputs`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if not inputs.calibration_feeds:
        raise ValueError("int8 needs calibration text")
    model = onnx.load(str(src))
    consumers = _weight_consumers(model)
    absmax = _activation_absmax(model, list(consumers), inputs)
    _smooth(model, consumers, absmax, SMOOTHING_ALPHA)
    smoothed = dst.with_name(dst.stem + ".smoothed.onnx")
    onnx.save(model, str(smoothed))
    with _root_warnings_dropped():
        quantize_dynamic(
            str(smoothed), str(dst), weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul", "Attention"],
            # Activation x activation products (unfused attention) have no weight to quantize.
            nodes_to_exclude=_activation_matmuls(model),
            # Shape inference cannot type contrib ops' outputs (Attention); they are all float.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    smoothed.unlink()


class _DropRootWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextmanager
def _root_warnings_dropped() -> Iterator[None]:
    """onnxruntime.quantization logs generic advice ("consider pre-processing") through the
    root logger; on a user's first run it reads like a problem, so it is dropped here."""
    root = logging.getLogger()
    drop = _DropRootWarnings()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


_INT8 = (f"SmoothQuant scaling (alpha {SMOOTHING_ALPHA}, calibrated on the calibration texts), "
         "then dynamic int8 with per-channel weights (quantize_dynamic, MatMul and Attention)")

RECIPES: tuple[Recipe, ...] = (
    Recipe("fp32-fused", "fp32", "fp32",
           "ONNX Runtime transformer fusions (onnxruntime.transformers.optimizer, bert, "
           "opt_level 0; residual adds left as Add + LayerNormalization)", fuse_transformer_ops),
    Recipe("int8-smoothquant", "int8", "fp32", f"plain graph: {_INT8}", quantize_int8_smoothed),
    Recipe("int8-smoothquant-fused", "int8", "fp32-fused", f"fused graph: {_INT8}",
           quantize_int8_smoothed),
    Recipe("fp16-fused", "fp16", "fp32-fused", "the fused graph in float16 with float32 inputs and "
           "outputs (onnxruntime.transformers.float16)", convert_fp16),
)


def build_variants(fp32_path: Path, out_dir: Path, recipes: Sequence[Recipe],
                   inputs: BuildInputs, *,
                   on_recipe: Callable[[Recipe], None] | None = None,
                   ) -> tuple[dict[str, Path], dict[str, str]]:
    """Build `recipes` into `out_dir`: (paths of those built, errors of those that failed).

    A recipe that fails to build is reported, not raised: fp32 can always be served.
    """
    built: dict[str, Path] = {"fp32": fp32_path}
    errors: dict[str, str] = {}
    for recipe in recipes:
        if on_recipe is not None:
            on_recipe(recipe)
        if recipe.base not in built:
            errors[recipe.name] = f"its base {recipe.base} was not built"
            continue
        path = out_dir / f"{recipe.name}.onnx"
        try:
            recipe.build(built[recipe.base], path, inputs)
        except Exception as error:  # a broken recipe must not stop the others or fp32
            log.warning("variant %s failed to build: %s", recipe.name, error)
            errors[recipe.name] = f"{type(error).__name__}: {error}"
            continue
        built[recipe.name] = path
    del built["fp32"]
    return built, errors


def recipes_for(precisions: Sequence[Precision]) -> tuple[Recipe, ...]:
    """The recipes that make the given precisions, with the bases they are built from."""
    wanted = [r for r in RECIPES if r.precision in precisions]
    bases = {r.base for r in wanted}
    return tuple(r for r in RECIPES if r in wanted or r.name in bases)


def with_bases(recipes: Sequence[Recipe], name: str) -> tuple[Recipe, ...]:
    """Recipe `name` of `recipes` and those it is built from, in build order (none if
    `name` is fp32, the export itself, or no recipe of them)."""
    by_name = {r.name: r for r in recipes}
    chain: list[Recipe] = []
    while name in by_name:
        chain.append(by_name[name])
        name = by_name[name].base
    return tuple(reversed(chain))


def _weight_consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Activation tensor -> the MatMul/Attention nodes that multiply it by a float weight."""
    initializers = {i.name: i for i in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Attention") or len(node.input) < 2:
            continue
        weight = initializers.get(node.input[1])
        # A weight shared with another node cannot be rescaled for this node alone.
        if weight is None or uses[weight.name] != 1 or len(weight.dims) != 2:
            continue
        consumers.setdefault(node.input[0], []).append(node)
    return consumers


def _activation_matmuls(model: onnx.ModelProto) -> list[str]:
    initializers = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and not any(i in initializers for i in n.input)]


def _activation_absmax(model: onnx.ModelProto, names: list[str],
                       inputs: BuildInputs) -> dict[str, Floats]:
    """Per-channel max |x| of each named tensor over the calibration batches, padded like
    served traffic (padding rows go through the same int8 scale when served)."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in names:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                     None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(probe.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    graph_inputs = {i.name for i in session.get_inputs()}
    absmax: dict[str, Floats] = {}
    for feed in inputs.calibration_feeds:
        values = session.run(names, {k: v for k, v in feed.items() if k in graph_inputs})
        for name, value in zip(names, values, strict=True):
            channel_max = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            absmax[name] = np.maximum(absmax[name], channel_max) if name in absmax else channel_max
    return absmax


def _smooth(model: onnx.ModelProto, consumers: Mapping[str, list[onnx.NodeProto]],
            absmax: Mapping[str, Floats], alpha: float) -> None:
    """x @ W == (x / s) @ (s * W): divide each activation channel by s and scale the matching
    weight rows by s, with s = max|x|^alpha / max|W|^(1 - alpha) (SmoothQuant). The division is
    an explicit Mul (it cannot be folded into a LayerNorm whose output also feeds a residual)."""
    import onnx
    from onnx import numpy_helper

    initializers = {i.name: i for i in model.graph.initializer}
    for activation, nodes in consumers.items():
        weights = [numpy_helper.to_array(initializers[n.input[1]]) for n in nodes]
        weight_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        scale = (np.maximum(absmax[activation], 1e-5) ** alpha
                 / np.maximum(weight_max, 1e-5) ** (1.0 - alpha)).astype(np.float32)
        for node, weight in zip(nodes, weights, strict=True):
            scaled = (weight * scale[:, None]).astype(np.float32)
            initializers[node.input[1]].CopyFrom(numpy_helper.from_array(scaled, node.input[1]))
        inverse = numpy_helper.from_array((1.0 / scale).astype(np.float32),
                                          f"{activation}_smooth_inv")
        model.graph.initializer.append(inverse)
        smoothed = f"{activation}_smoothed"
        for node in nodes:
            node.input[0] = smoothed
        # Insert before the first consumer so the node list stays topologically sorted.
        first = min(list(model.graph.node).index(n) for n in nodes)
        model.graph.node.insert(first, onnx.helper.make_node(
            "Mul", [activation, inverse.name], [smoothed], name=f"{activation}_smooth"))




def bf16_unsupported_reason() -> str:
    """Why bf16 cannot be built and checked here, or '' if it can: ONNX Runtime's CPU provider
    has no bfloat16 MatMul kernel, so the question is put to the runtime itself (a one-MatMul
    bf16 graph on every available provider) rather than assumed."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "bf16_probe",
        [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.BFLOAT16, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    providers = ort.get_available_providers()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except Exception as error:  # NOT_IMPLEMENTED on the CPU provider
        first_line = str(error).strip().splitlines()[0]
        return (f"no available ONNX Runtime provider ({', '.join(providers)}) runs a bfloat16 "
                f"MatMul ({first_line[:160]})")
    del session
    return ""
