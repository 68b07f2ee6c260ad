"""`AverageCheckpoints`: the mean of the last N weight snapshots, written at the end of
training (the paper averages the last 5 (base) or 20 (big) checkpoints).

Snapshots are files beside the checkpoints, `.snapshot-step<step>.pt` (the model's weights, no
training state), written by the process of rank 0 alone (it writes the average; under DDP every
rank holds the same weights, under `trainer=fsdp` every rank sends rank 0 its shards); the
oldest is deleted as a new one comes, and the rest once the average is written. On disk rather
than in memory, as fairseq keeps its epoch checkpoints: 20 snapshots of the big model would be
17 GB of host memory. A run resumed in the same directory takes up the snapshots up to its
checkpoint's step and drops later ones, so its average is of the same weights as an
uninterrupted run's."""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn

from aiayn.errors import CheckpointError
from aiayn.inference.averaging import average_state_dicts
from aiayn.inference.checkpoint import load_tensors, read_checkpoint, save_atomically

SNAPSHOT = re.compile(r"\.snapshot-step(\d+)\.pt")


class AverageCheckpoints(L.Callback):
    """Average the last `last` weight snapshots into `<dirpath>/<filename>` at train end.

    A snapshot is taken after each validation (`every_n_steps=None`) or every `every_n_steps`
    optimizer steps, and of the final weights; one per step. The file is written with
    `trainer.save_checkpoint(weights_only=True)`, so it carries the hyper-parameters and the
    tokenizer like any checkpoint, plus `averaged_from` (the snapshots' steps).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        last: int = 5,
        every_n_steps: int | None = None,
        filename: str = "averaged.ckpt",
    ) -> None:
        if last < 1:
            raise ValueError(f"AverageCheckpoints.last must be >= 1, got {last}")
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"AverageCheckpoints.every_n_steps must be >= 1, got {every_n_steps}")
        self.dirpath, self.every_n_steps, self.filename = dirpath, every_n_steps, filename
        self.last = last
        self.snapshots: deque[tuple[int, Path]] = deque()  # (step, file), oldest first
        self._step = -1  # of the last snapshot, on every rank (under fsdp all take part)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Take up this directory's snapshots up to the starting step (a resume: the step is
        restored by now, unlike at `on_fit_start`); delete the others (a later part of an
        attempt that was not kept, or a run before this one)."""
        self._step = trainer.global_step  # taken before the checkpoint: on every rank alike
        if not trainer.is_global_zero:
            return
        found = []
        for path in self.path(trainer).parent.glob(".snapshot-step*.pt"):
            match = SNAPSHOT.fullmatch(path.name)
            if match and 0 < int(match[1]) <= trainer.global_step:
                found.append((int(match[1]), path))
            elif match:
                path.unlink()
        self.snapshots = deque(sorted(found))
        self._forget_beyond(self.last)

    def _forget_beyond(self, count: int) -> None:
        while len(self.snapshots) > count:
            self.snapshots.popleft()[1].unlink(missing_ok=True)

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step == self._step:  # the same decision on every rank (fsdp gathers below)
            return
        self._step = step
        # whole weights on rank 0 (trainer=fsdp: a gather every rank joins, since
        # save_distributed_checkpoint=false is enforced; the others then get {})
        weights = trainer.strategy.lightning_module_state_dict()
        if not trainer.is_global_zero:
            return
        weights = {name: tensor.detach().cpu() for name, tensor in weights.items()}
        path = self.path(trainer).with_name(f".snapshot-step{step}.pt")
        save_atomically(weights, path)
        self.snapshots.append((step, path))
        self._forget_beyond(self.last)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        if self.every_n_steps is None and fitting and not trainer.sanity_checking:
            self._snapshot(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._snapshot(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the final weights' checkpoint beside the file (saving is collective: every
        rank takes part), then, on rank 0, the same with the snapshots' mean for its weights,
        and delete the snapshots: the module keeps its weights and no copy of them is made."""
        self._snapshot(trainer, pl_module)
        path = self.path(trainer)
        final = path.with_name(f".{path.name}.final")  # never taken for the average
        trainer.save_checkpoint(final, weights_only=True)
        if not trainer.is_global_zero:
            return
        checkpoint = read_checkpoint(final)
        states = (_snapshot_state(p) for _, p in self.snapshots)
        checkpoint["state_dict"] = average_state_dicts(states)  # one snapshot read at a time
        checkpoint["averaged_from"] = [f"step {step}" for step, _ in self.snapshots]
        save_atomically(checkpoint, path)  # marked, so that `--last N` never counts it
        del checkpoint  # maps `final`
        final.unlink()
        self._forget_beyond(0)

    def path(self, trainer: L.Trainer) -> Path:
        """`dirpath/filename`; dirpath defaults to the ModelCheckpoint's, else
        `<default_root_dir>/checkpoints`."""
        directory = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None)
        return Path(directory or Path(trainer.default_root_dir) / "checkpoints") / self.filename


def _snapshot_state(path: Path) -> dict[str, Any]:
    """The weights of a snapshot (a state dict), or one CheckpointError naming the file."""
    hint = "delete it (and the other .snapshot-step*.pt) and train again"
    state = load_tensors(path, hint)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} is not a snapshot of weights (a state dict); {hint}")
    return state
