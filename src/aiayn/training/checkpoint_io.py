"""`AtomicCheckpointIO`: the trainer plugin every checkpoint of a run is written through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from aiayn.inference.checkpoint import save_atomically


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a checkpoint to `.<name>.tmp` beside its target, fsync, then rename over it.

    A process killed mid-write leaves the previous checkpoint intact (rename is atomic on
    POSIX file systems), so `last.ckpt` is always a complete, loadable file.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        save_atomically(checkpoint, path)
