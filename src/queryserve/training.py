"""What the `queryserve train` commands share: the device they train on (`--device`), and the
steps of the fine-tuning loop every MiniLM trainer runs (intent, both duplicates methods).

`auto` takes a CUDA GPU when PyTorch sees one and the CPU otherwise, so the same command trains
on a laptop and on a GPU machine; `cuda` where none is present is an error, not a silent CPU
run of an hour. PyTorch is imported only when a function here is called.
"""

from __future__ import annotations

from collections.abc import Callable
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


def warmup_then_linear(optimizer: Any, total: int, warmup_share: float,
                       spent: Callable[[], float] | None = None) -> Any:
    """A learning-rate schedule over `total` steps: a linear warm-up over the first
    `warmup_share` of them, then a linear decay to zero. With `spent` (the share of a time
    budget used so far, 0 to 1), it runs over steps or time, whichever is further on: a run
    cut short by its budget still ends its decay, where a step schedule would stop it at a
    high rate (how many steps fit a budget depends on the machine)."""
    import torch

    share = max(warmup_share, 1 / total)

    def factor(step: int) -> float:
        done = max(step / total, spent() if spent else 0.0)
        return max(0.0, min((done + 1 / total) / share, (1 - done) / max(1 - share, 1 / total)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def update(loss: Any, parameters: Any, optimizer: Any, schedule: Any) -> None:
    """One step: gradients of `loss`, clipped to norm 1, applied; the schedule moved on."""
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()


def cpu_copy(module: Any) -> dict[str, Any]:
    """`module`'s weights copied to the CPU: the best epoch's, kept aside while training goes on
    (on a GPU, without holding a second copy in its memory)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
