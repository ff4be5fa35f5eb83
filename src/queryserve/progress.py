"""The progress display of long work (training, embedding, batch jobs): what is running, a bar,
done of total, the time taken, and a status each task sets (give `status=""` when adding it);
and `quiet_logs`, which keeps libraries' log lines and bars from writing over it."""

from __future__ import annotations

import logging
import sys

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

# ONNX Runtime's fusion tools log every pass at INFO; the progress display says enough.
_NOISY = ("onnx_model", "onnx_model_bert", "fusion_base", "fusion_utils", "float16")


def quiet_logs() -> None:
    """Only the run's own progress display: no fusion pass logs, no transformers bars."""
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.WARNING)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    transformers_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def progress_bar(enabled: bool) -> Progress:
    """On stderr: stdout is the command's result (a batch job's summary went to a file
    behind the bar's last frame, and `jq` could not read it)."""
    from rich.console import Console

    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[status]}"), console=Console(stderr=True),
                    disable=not enabled)


def milestone(display: Progress, task: TaskID, status: str) -> None:
    """Set the task's status; where nobody watches the bar (no bar, or output to a log file),
    print it as a line on stderr too, so a long run's log keeps each epoch's figures and
    stdout keeps only the command's result."""
    display.update(task, status=status)
    if display.disable or not display.console.is_terminal:
        print(status, file=sys.stderr, flush=True)
