"""Export a Hugging Face encoder to ONNX with the task's pre- and post-processing in the graph.

Graph inputs are `input_ids` and `attention_mask` (int64 [batch, seq], both axes dynamic), plus
`token_type_ids` for the pair task on models that use segment ids. Outputs:
- embed: `embedding` float [batch, dim], pooled (mean, CLS or max, as the folder's
  sentence-transformers config says) and L2-normalised when the folder normalises;
- classify and pair: `probabilities` float [batch, labels] (softmax; sigmoid for one label).
So the server only tokenizes and slices rows. The same wrapper, run in PyTorch, is the
"original" that the accuracy gate and the before/after timings compare with.

torch and transformers are imported lazily: they are for export, never for serving.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from queryserve.optimize.source import Source

Floats = npt.NDArray[np.float32]
OPSET = 17


@dataclass(frozen=True)
class Signature:
    """The exported graph's contract with the serving pipeline."""

    inputs: tuple[str, ...]
    output: str

    @property
    def uses_token_types(self) -> bool:
        return "token_type_ids" in self.inputs


def signature(source: Source, model: Any | None = None) -> Signature:
    output = "embedding" if source.task == "embed" else "probabilities"
    inputs: tuple[str, ...] = ("input_ids", "attention_mask")
    if source.task == "pair" and _segment_ids(source, model):
        inputs += ("token_type_ids",)
    return Signature(inputs, output)


def load_torch_model(source: Source) -> Any:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    cls = AutoModel if source.task == "embed" else AutoModelForSequenceClassification
    # Eager attention: ONNX Runtime's Attention fusion recognises the eager pattern, not SDPA's.
    # fp32 always: a checkpoint saved in fp16 (to keep a repository small) is the same model,
    # and the graph is exported, quantized and gated from fp32.
    return cls.from_pretrained(str(source.path), attn_implementation="eager",
                               dtype=torch.float32).eval()


def wrap(source: Source, model: Any) -> Any:
    """A torch module with the served signature around the Hugging Face model."""
    import torch

    accepts_types = "token_type_ids" in inspect.signature(model.forward).parameters
    sig = signature(source, model)

    class Wrapper(torch.nn.Module):
        signature: Signature

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *token_types: Any) -> Any:
            # Keyword arguments: transformers 5 rejects positional ones. Single-segment token
            # types are all zero, so they are made here rather than fed by the server.
            extra = {}
            if accepts_types:
                extra["token_type_ids"] = (token_types[0] if token_types
                                           else torch.zeros_like(input_ids))
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)
            if source.task != "embed":
                logits = out.logits
                return (torch.sigmoid(logits) if logits.shape[-1] == 1
                        else torch.softmax(logits, dim=-1))
            return _pool(torch, out.last_hidden_state, attention_mask, source)

    Wrapper.signature = sig  # a class attribute: nn.Module's setattr only takes tensors
    return Wrapper().eval()


def _pool(torch: Any, hidden: Any, attention_mask: Any, source: Source) -> Any:
    """The arithmetic of sentence-transformers' Pooling and Normalize modules."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if source.pooling == "cls":
        pooled = hidden[:, 0]
    elif source.pooling == "max":
        pooled = torch.where(mask > 0, hidden, torch.full_like(hidden, -1e9)).max(dim=1).values
    else:
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2.0, dim=1) if source.normalize else pooled


def _segment_ids(source: Source, model: Any | None) -> bool:
    """Whether pairs need segment ids: the model takes them and has more than one type."""
    import json

    config = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
    if int(config.get("type_vocab_size", 0)) < 2:
        return False
    if model is None:
        return True
    return "token_type_ids" in inspect.signature(model.forward).parameters


def export_encoder(source: Source, out_path: Path) -> Signature:
    """Export the folder to `out_path` (fp32, opset 17); returns the graph's signature."""
    import torch

    model = load_torch_model(source)
    wrapper = wrap(source, model)
    sig: Signature = wrapper.signature
    # The example batch is padded on purpose, so tracing cannot specialise on an all-ones mask.
    input_ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.int64)
    attention_mask = (input_ids != 0).to(torch.int64)
    example = [input_ids, attention_mask]
    if sig.uses_token_types:
        example.append(torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.int64))
    token_axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings from transformers' mask helpers
        torch.onnx.export(
            wrapper, tuple(example), str(out_path),
            input_names=list(sig.inputs), output_names=[sig.output],
            dynamic_axes={**{name: token_axes for name in sig.inputs}, sig.output: {0: "batch"}},
            opset_version=OPSET, dynamo=False, do_constant_folding=True,
        )
    _record_shape(out_path, source)
    return sig


def _record_shape(path: Path, source: Source) -> None:
    """Keep the attention shape in the model, so the fusion step needs no Hugging Face folder."""
    import onnx

    model = onnx.load(str(path))
    for key, value in (("num_attention_heads", source.heads), ("hidden_size", source.hidden),
                       ("model_type", source.model_type)):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(model, str(path))


def run_torch(wrapper: Any, feeds: Sequence[dict[str, npt.NDArray[np.int64]]]) -> Floats:
    """The wrapper's outputs for padded batches of feeds, in PyTorch fp32."""
    import torch

    names = wrapper.signature.inputs
    parts = []
    with torch.inference_mode():
        for feed in feeds:
            args = [torch.from_numpy(feed[name]) for name in names]
            parts.append(wrapper(*args).numpy().astype(np.float32))
    return np.concatenate(parts)
