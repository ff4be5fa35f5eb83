"""CTranslate2Backend's choice of device, without a GPU: a stand-in ctranslate2 module."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from queryserve.backends.ctranslate2 import CTranslate2Backend
from queryserve.config import ModelConfig, TensorSpec


class Translator:
    """Sees a GPU but cannot use it, as ctranslate2 4.x does with CUDA 13 libraries only."""

    def __init__(self, path: str, device: str, **options: Any) -> None:
        self.device = device

    def translate_batch(self, sources: list[list[str]], **options: Any) -> list[Any]:
        if self.device == "cuda":
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")
        return []


def test_a_gpu_it_cannot_use_falls_back_to_the_cpu(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ctranslate2").mkdir()
    (tmp_path / "ctranslate2" / "model.bin").touch()
    fake = types.SimpleNamespace(get_cuda_device_count=lambda: 1, Translator=Translator)
    monkeypatch.setitem(sys.modules, "ctranslate2", fake)
    config = ModelConfig(
        name="spell", path=tmp_path, backend="ctranslate2", pipeline="text2text",
        max_batch_size=8, inputs=(TensorSpec("text", "BYTES", (1,)),),
        outputs=(TensorSpec("generated_text", "BYTES", (1,)),))
    backend = CTranslate2Backend(config, 1)
    assert backend.device == "cpu"
    assert backend.translator.device == "cpu"
