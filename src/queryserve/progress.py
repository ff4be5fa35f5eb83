"""The progress display of long work (training, embedding, batch jobs): what is running, a bar,
done of total, the time taken, and a status each task sets (give `status=""` when adding it)."""

from __future__ import annotations

import sys

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


def progress_bar(enabled: bool) -> Progress:
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[status]}"), disable=not enabled)


def milestone(display: Progress, task: TaskID, status: str) -> None:
    """Set the task's status; where nobody watches the bar (no bar, or output to a log file),
    print it as a line on stderr too, so a long run's log keeps each epoch's figures and
    stdout keeps only the command's result."""
    display.update(task, status=status)
    if display.disable or not display.console.is_terminal:
        print(status, file=sys.stderr, flush=True)
