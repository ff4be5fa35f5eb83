"""Regenerate the committed Python modules of this folder's `.proto` files.

    .venv/bin/python -m queryserve.server.grpc.proto.regenerate

which runs, from `src/` (so the generated modules import each other by their package path):

    python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
        queryserve/server/grpc/proto/model_config.proto \
        queryserve/server/grpc/proto/grpc_service.proto

and then points each `_pb2.py` at the descriptor pool of `_pool.py` instead of protobuf's
default one (see there why). grpcio-tools is a dev dependency (pyproject's `dev` extra); the
server needs only grpcio and protobuf at run time. Regenerate after editing a `.proto`, and
commit the `.proto` and the `_pb2.py`, `_pb2.pyi` and `_pb2_grpc.py` files together.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[4]
FOLDER = "queryserve/server/grpc/proto"
PROTOS = ("model_config.proto", "grpc_service.proto")
DEFAULT_POOL = "_descriptor_pool.Default()"
IMPORTS_END = "# @@protoc_insertion_point(imports)\n"


def use_own_pool(module: Path) -> None:
    text = module.read_text()
    if text.count(DEFAULT_POOL) != 1 or IMPORTS_END not in text:
        raise SystemExit(f"{module}: protoc's output changed shape; update {__file__}")
    text = text.replace(DEFAULT_POOL, "_own_pool.POOL").replace(
        IMPORTS_END, f"from {FOLDER.replace('/', '.')} import _pool as _own_pool\n{IMPORTS_END}")
    module.write_text(text)


def main() -> int:
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.",
               "--pyi_out=.", "--grpc_python_out=.", *(f"{FOLDER}/{p}" for p in PROTOS)]
    done = subprocess.run(command, cwd=SRC)
    if done.returncode:
        return done.returncode
    for proto in PROTOS:
        use_own_pool(SRC / FOLDER / proto.replace(".proto", "_pb2.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
