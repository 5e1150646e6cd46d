"""The progress bar on stderr (tqdm), quiet when stderr is not a terminal.

Ranks run in other processes (or under mpirun), so rank 0 of each launch appends one byte per
step to a file and a thread here turns the file's length into the bar's position.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, shown: bool = True):
        # disable=None: tqdm stays quiet when stderr is not a terminal.
        disable = None if shown else True
        self.bar = tqdm(total=total, unit="step", file=sys.stderr, disable=disable, leave=False)
        self.dir = tempfile.TemporaryDirectory(prefix="weft-bench-progress-")
        self.done = 0  # steps of the launches already finished
        self.path: Path | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def launch(self, name: str, steps: int) -> str:
        """The file rank 0 of the next launch writes to; the previous launch counts as done."""
        if self.path is not None:
            self.done += self.steps
        self.steps = steps
        self.path = Path(self.dir.name, f"{name.replace('/', '_')}-{self.done}")
        self.path.touch()
        self.bar.set_description(name)
        return str(self.path)

    def _poll(self) -> None:
        while not self.stop.wait(0.2):
            path = self.path
            if path is not None and path.exists():
                self.bar.n = self.done + min(self.steps, path.stat().st_size)
                self.bar.refresh()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.bar.close()
        self.dir.cleanup()


def step_writer(path: str | None):
    """The step() callback of a rank: appends to `path` (rank 0), or does nothing."""

    def step() -> None:
        if path is not None:
            with open(path, "ab") as f:
                f.write(b".")

    return step
