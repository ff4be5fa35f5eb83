"""Builds .dev16/, the folder a lent 16-core GPU machine's `device` call carries, from the local
checkout (run here, not on the device), for `queryserve serve --workers N` scaling:

- run.sh, workers16.py, bench_fast.py: copied from benchmarks/device/ (the run, time-bounded).
- wheels/: what that machine's Python 3.12 lacks (httptools, orjson, rapidfuzz, hdrhistogram).

- embed/model.onnx.xz: the served `embed` variant (model_repository/embed/model.onnx,
  int8-smoothquant-fused) with every row of its word-embedding table that no benchmark input
  can reach set to zero, then xz-compressed. The rows kept: ids 0-999 (special tokens) and every
  id the tokenizer gives for the queries file and the model.yaml warm-up texts. The graph, the
  table's shape and every other weight are unchanged, so each request costs the same and every
  input this benchmark sends gives bit-identical outputs (checked by --check), at 1/3 the bytes
  (the fp32 table is 47 of the 58.6 MB and does not compress otherwise).
- embed/tokenizer.json, embed/model.yaml (verbatim), queries.jsonl (MASSIVE test, as bench's
  default `massive` set).
- duplicates/: the served `duplicates` cross-encoder trimmed the same way (the rows kept: the
  hard pairs as the pipeline hints and tokenizes them, and the warm-up text), its model.yaml and
  tokenizer.json, and hard_pairs.json (`queryserve.duplicates.hard_pairs`): what workers16.py's
  `hardpairs` item asks the served model on that machine's processor (issue 41: the decisions
  held on one host kind and not the other).

    .venv/bin/python benchmarks/device/make_payload.py [--check] [--cuda]

With --cuda, also .gpuw0 ... .gpuwN (issue 40, item 6: workers sharing a GPU), each under the
64 MiB a call carries: the onnxruntime-gpu wheel for Python 3.12 (the CUDA 13 build that ran on
the lent H100 on 2026-11-22, BENCHMARKS.md "GPU") and `embed` as fp16 (fp32-fused, the rows
no input reaches zeroed, then queryserve's own fp16 recipe), in one tar cut in chunks, its
sha256 in the last; `bash benchmarks/device/cuda.sh carry K` on the device, one call a chunk,
puts them together there, and workers16.py's `cuda` plan item serves them.

then, with only src/ in the tree that travels (the committed models are over the 64 MiB a
call carries), one device call carrying .dev16:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/site .dev16/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD/src \
        && bash .dev16/run.sh
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import numpy_helper
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent
WHEELS = ("httptools==0.9.0", "orjson==3.13.0", "rapidfuzz==3.14.6", "hdrhistogram==0.10.8")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
SRC = ROOT / "model_repository" / "embed"
HERE = ROOT / ".dev16"
TABLE = "model.embeddings.word_embeddings.weight"
PAIRS_SRC = ROOT / "model_repository" / "duplicates"
PAIRS_TABLE = "model.bert.embeddings.word_embeddings.weight"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true",
                        help="compare the trimmed model with the original on every query")
    parser.add_argument("--cuda", action="store_true",
                        help="also the chunks .gpuw* for the `cuda` plan item")
    args = parser.parse_args()
    (HERE / "embed").mkdir(parents=True, exist_ok=True)
    for script in ("run.sh", "workers16.py", "bench_fast.py"):
        shutil.copy(SCRIPTS / script, HERE / script)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                    *(f"--platform={p}" for p in PLATFORMS), "-d", str(HERE / "wheels"),
                    *WHEELS], check=True)
    shutil.copy(ROOT / "data" / "massive-en" / "test.jsonl", HERE / "queries.jsonl")
    shutil.copy(SRC / "tokenizer.json", HERE / "embed" / "tokenizer.json")
    shutil.copy(SRC / "model.yaml", HERE / "embed" / "model.yaml")
    config = yaml.safe_load((SRC / "model.yaml").read_text())
    texts = [json.loads(line)["text"] for line in
             (HERE / "queries.jsonl").read_text().splitlines() if line.strip()]
    texts += [w["text"] for w in config.get("model_warmup", [])]
    tokenizer = Tokenizer.from_file(str(SRC / "tokenizer.json"))
    used = set(range(1000))
    for encoding in tokenizer.encode_batch(texts):
        used.update(encoding.ids)
    raw = trim(SRC / "model.onnx", TABLE, used, HERE / "embed" / "model.onnx.xz")
    if args.check:
        check(raw, texts)
    duplicates()
    if args.cuda:
        cuda_chunks(used)


def trim(source: Path, table_name: str, used: set[int], target: Path) -> bytes:
    """`source` with every row of its word-embedding table outside `used` zeroed, xz'd into
    `target`; returns the trimmed model's bytes."""
    model = onnx.load(str(source))
    tensor = next(t for t in model.graph.initializer if t.name == table_name)
    table = numpy_helper.to_array(tensor).copy()
    keep = np.zeros(table.shape[0], dtype=bool)
    keep[sorted(used)] = True
    table[~keep] = 0.0
    tensor.CopyFrom(numpy_helper.from_array(table, table_name))
    raw = model.SerializeToString()
    target.write_bytes(lzma.compress(raw, preset=6))
    print(f"{source.parent.name}: kept {keep.sum()} of {len(keep)} rows; {len(raw) / 1e6:.1f} MB "
          f"-> {target.stat().st_size / 1e6:.1f} MB xz")
    return raw


CUDA_WHEEL = "onnxruntime-gpu==1.31.1"
CHUNK_BYTES = 60_000_000


def cuda_chunks(used: set[int]) -> None:
    """The onnxruntime-gpu wheel and embed in fp16, tarred and cut into .gpuw0, .gpuw1, ..."""
    import hashlib
    import tarfile
    import tempfile

    sys.path.insert(0, str(ROOT / "src"))
    from queryserve.optimize.recipes import convert_fp16

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", *(f"--platform={p}" for p in PLATFORMS), "-d", str(work / "wheel"),
                        CUDA_WHEEL], check=True)
        fp32 = work / "fp32.onnx"
        fp32.write_bytes(trim(SRC / "variants" / "fp32-fused.onnx", TABLE, used,
                              work / "fp32.onnx.xz"))
        (work / "embed").mkdir()
        convert_fp16(fp32, work / "fp16.onnx")
        (work / "embed" / "model.onnx.xz").write_bytes(
            lzma.compress((work / "fp16.onnx").read_bytes(), preset=6))
        tar = work / "payload.tar"
        with tarfile.open(tar, "w") as archive:
            archive.add(work / "wheel", "wheel")
            archive.add(work / "embed", "embed")
        data = tar.read_bytes()
        for old in ROOT.glob(".gpuw*"):
            shutil.rmtree(old)
        count = -(-len(data) // CHUNK_BYTES)
        for k in range(count):
            folder = ROOT / f".gpuw{k}"
            folder.mkdir()
            (folder / f"c{k}").write_bytes(data[k * CHUNK_BYTES:(k + 1) * CHUNK_BYTES])
        (ROOT / f".gpuw{count - 1}" / "payload.sha256").write_text(
            hashlib.sha256(data).hexdigest() + "\n")
        print(f"cuda: {len(data) / 1e6:.1f} MB in {count} chunks, .gpuw0 to .gpuw{count - 1}; "
              f"embed fp16 {(work / 'embed' / 'model.onnx.xz').stat().st_size / 1e6:.1f} MB xz")


def duplicates() -> None:
    """The served cross-encoder, trimmed to the hard pairs, and the pairs with what a person
    says of each."""
    sys.path.insert(0, str(ROOT / "src"))
    from queryserve.duplicates.hard_pairs import HARD_PAIRS
    from queryserve.pipelines.pairs.features import hinted

    folder = HERE / "duplicates"
    folder.mkdir(parents=True, exist_ok=True)
    report = json.loads((PAIRS_SRC / "prepare.json").read_text())
    served = next(v["file"] for v in report["variants"] if v["name"] == report["chosen"])
    shutil.copy(PAIRS_SRC / "tokenizer.json", folder / "tokenizer.json")
    shutil.copy(PAIRS_SRC / "model.yaml", folder / "model.yaml")
    config = yaml.safe_load((PAIRS_SRC / "model.yaml").read_text())
    pairs = [(p.left, p.right) for p in HARD_PAIRS]
    tokenizer = Tokenizer.from_file(str(PAIRS_SRC / "tokenizer.json"))
    used = set(range(1000))
    for left, right in hinted(pairs):
        used.update(tokenizer.encode(left, right).ids)
    for warmup in config.get("model_warmup", []):
        used.update(tokenizer.encode(warmup["text"]).ids)
    trim(PAIRS_SRC / served, PAIRS_TABLE, used, folder / "model.onnx.xz")
    (folder / "hard_pairs.json").write_text(json.dumps(
        {"variant": report["chosen"], "pairs": [[p.left, p.right, p.duplicate]
                                                 for p in HARD_PAIRS]}, indent=1) + "\n")


def check(raw: bytes, texts: list[str]) -> None:
    """Every query and warm-up text through both models, batch 1 and batch 64: bit-equal."""
    sys.path.insert(0, str(ROOT / "src"))
    from queryserve.optimize.candidates import engine

    trimmed = HERE / "check-trimmed.onnx"
    trimmed.write_bytes(raw)
    try:
        a = engine(SRC / "model.onnx", SRC / "tokenizer.json", threads=1)
        b = engine(trimmed, SRC / "tokenizer.json", threads=1)
        worst = 0.0
        for size in (1, 64):
            for i in range(0, len(texts), size):
                batch = texts[i:i + size]
                x, y = a(batch), b(batch)
                worst = max(worst, float(np.max(np.abs(np.asarray(x) - np.asarray(y)))))
        print(f"max |difference| over {len(texts)} texts at batch 1 and 64: {worst}")
    finally:
        trimmed.unlink()


if __name__ == "__main__":
    main()
