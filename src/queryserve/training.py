"""What the `queryserve train` commands share: the device they train on (`--device`).

`auto` takes a CUDA GPU when PyTorch sees one and the CPU otherwise, so the same command trains
on a laptop and on a GPU machine; `cuda` where none is present is an error, not a silent CPU
run of an hour. PyTorch is imported only when a device is asked for.
"""

from __future__ import annotations

from typing import Any

from queryserve.errors import QueryServeError

DEVICES = ("auto", "cpu", "cuda")


class DeviceError(QueryServeError):
    pass


def resolve_device(name: str) -> Any:
    """The torch.device that `--device name` means here."""
    import torch

    if name not in DEVICES:
        raise DeviceError(f"--device {name!r} is not one of {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: PyTorch sees no CUDA GPU here (a CPU build of torch, "
                          "or no driver); use --device cpu or auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        # TF32 for fp32 matrix products. And no cuDNN attention: it re-plans for each new
        # sequence length, which every length-bucketed batch brings (measured on an H100 for
        # the spelling seq2seq: ~11 ms of host time per call, bf16 steps 20x slower than fp32).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cuda.enable_cudnn_sdp(False)
    return torch.device(name)
