"""The supervisor's housekeeping that needs no server."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from queryserve.errors import ServeError
from queryserve.server.run import ServeOptions
from queryserve.server.workers.supervisor import (
    FOLDER_PREFIX,
    Supervisor,
    _remove_orphaned_folders,
)
from tests.conftest import write_fake_model


def test_a_killed_supervisor_s_folder_is_removed_by_the_next_one() -> None:
    """A supervisor killed with SIGKILL leaves its control folder behind; the next one removes
    it, and leaves the folders of supervisors that live."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead_pid = int(ended.stdout)  # ended: nobody has it (unless reused at once, then kept)
    orphan = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{dead_pid}-"))
    (orphan / "worker-0.sock").write_text("")
    alive = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    try:
        _remove_orphaned_folders()
        assert not orphan.exists()
        assert alive.is_dir()
    finally:
        for folder in (orphan, alive):
            if folder.exists():
                (folder / "worker-0.sock").unlink(missing_ok=True)
                folder.rmdir()


def test_no_writable_temporary_folder_is_said_in_a_line(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only root with no /tmp mounted: --workers 2 ended in a 24-line traceback (one
    worker needs no folder, so a 2-core pod showed nothing until its CPU limit grew)."""
    write_fake_model(tmp_path, "fast")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))
    with pytest.raises(ServeError, match="--workers 2 needs a writable temporary folder"):
        Supervisor(ServeOptions(tmp_path, port=0), 2).run()
