"""Build the two model folders Infinity's optimum (ONNX Runtime) engine serves.

Runs in ``.peers/venv-infinity`` (it has optimum-cli and onnxruntime):

    .peers/venv-infinity/bin/python benchmarks/peers/infinity_export.py MODEL_DIR OUT_ROOT

* ``OUT_ROOT/onnx-fp32``: ``optimum-cli export onnx --library-name transformers``. Without that
  flag the export has sentence-transformers outputs (``token_embeddings``/``sentence_embedding``)
  and Infinity fails with ``KeyError: 'last_hidden_state'``. ``model.onnx`` sits at the top of
  the folder because Infinity must be started from inside it with ``--model-id .`` (it passes
  optimum an absolute file name, which optimum 2.x rejects).
* ``OUT_ROOT/onnx-int8``: the same folder with ``model_quantized.onnx`` (ORT dynamic int8 weights)
  instead of ``model.onnx``, so there is no doubt which one it serves. Weights are quantized per
  channel: on 400 MASSIVE queries that kept cosine to fp32 at mean 0.992 / min 0.963, against
  0.962 / 0.845 per tensor (``quantize_dynamic``'s default), and it was no slower.
  On CPU the optimum engine picks any ``*quantize*.onnx`` it finds, so this file must never be in
  the fp32 folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def export_fp32(model_dir: Path, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cli = Path(sys.executable).with_name("optimum-cli")
    subprocess.run(
        [str(cli), "export", "onnx", "--model", str(model_dir), "--task", "feature-extraction",
         "--library-name", "transformers", str(tmp)],
        check=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # only a finished export takes the final name


def quantize_int8(fp32: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(fp32, tmp, ignore=shutil.ignore_patterns("*.onnx"))
    quantize_dynamic(fp32 / "model.onnx", tmp / "model_quantized.onnx", weight_type=QuantType.QInt8,
                     per_channel=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> int:
    model_dir, root = Path(sys.argv[1]), Path(sys.argv[2])
    root.mkdir(parents=True, exist_ok=True)
    fp32, int8 = root / "onnx-fp32", root / "onnx-int8"
    if not (fp32 / "model.onnx").exists():
        export_fp32(model_dir, fp32)
    if not (int8 / "model_quantized.onnx").exists():
        quantize_int8(fp32, int8)
    print(f"infinity models: {fp32} {int8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
