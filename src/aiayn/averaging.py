"""Checkpoint averaging (the paper averages the last 5 (base) or 20 (big) checkpoints).

Command:
    python -m aiayn.averaging a.ckpt b.ckpt ... -o averaged.ckpt
    python -m aiayn.averaging --last 5 <run>/checkpoints -o averaged.ckpt

`--last N DIR` takes the N checkpoints of DIR with the highest `global_step` (one per step:
`last.ckpt` and a step checkpoint of the same step count once). Keep one checkpoint per
validation with `callbacks.model_checkpoint.save_top_k=-1
"callbacks.model_checkpoint.filename='step{step}'"`, or use the callback below.

Callback (`conf/callbacks/average.yaml`): `AverageCheckpoints` keeps the last N weight
snapshots in CPU memory (N x the model's size) and writes `averaged.ckpt` at the end of
training. Snapshots are not saved in checkpoints: after a resume only the new ones count.

The averaged checkpoint is the newest input's (hyper-parameters, tokenizer) with the mean
weights (floating tensors; others are taken from the newest) and without optimizer state: it
loads, evaluates and translates like any other, but does not resume training.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from aiayn.callbacks import AtomicCheckpointIO

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "callbacks")


class AveragingError(ValueError):
    """Checkpoints that cannot be averaged; the message names the file or key."""


def average_state_dicts(states: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Elementwise mean of the floating-point tensors (summed in float64, cast back to each
    tensor's dtype); non-floating tensors are taken from the last state. Keys and shapes must
    agree."""
    if not states:
        raise AveragingError("nothing to average: no checkpoints given")
    last = states[-1]
    for i, state in enumerate(states):
        if state.keys() != last.keys():
            diff = sorted(set(state) ^ set(last))
            raise AveragingError(f"state {i} differs in keys from the last one: {diff[:5]}")
        for key, value in state.items():
            if value.shape != last[key].shape:
                raise AveragingError(
                    f"{key}: shape {tuple(value.shape)} in state {i} but "
                    f"{tuple(last[key].shape)} in the last one"
                )
    out = {}
    for key, value in last.items():
        if value.is_floating_point():
            total = sum(state[key].double() for state in states)
            out[key] = (total / len(states)).to(value.dtype)
        else:
            out[key] = value.clone()
    return out


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise AveragingError(f"checkpoint {path} not found")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:  # torch raises many types for foreign or broken files
        raise AveragingError(f"cannot read checkpoint {path}: {error}") from error
    if "state_dict" not in checkpoint:
        raise AveragingError(f"{path} is not a Lightning checkpoint (no state_dict)")
    return checkpoint


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The checkpoint with the mean weights of `paths` (all must have the same model
    hyper-parameters); hyper-parameters, tokenizer and metadata come from the last path."""
    checkpoints = [_load(Path(p)) for p in paths]
    if not checkpoints:
        raise AveragingError("nothing to average: no checkpoints given")
    newest = checkpoints[-1]
    model = newest.get("hyper_parameters", {}).get("model")
    for path, checkpoint in zip(paths, checkpoints, strict=True):
        if checkpoint.get("hyper_parameters", {}).get("model") != model:
            raise AveragingError(
                f"{path} has other model hyper-parameters than {paths[-1]}; average "
                "checkpoints of one run"
            )
    out = {k: v for k, v in newest.items() if k not in TRAINING_STATE}
    out["state_dict"] = average_state_dicts([c["state_dict"] for c in checkpoints])
    out["averaged_from"] = [str(p) for p in paths]
    return out


def last_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The `n` checkpoints of `directory` with the highest global steps, oldest first."""
    by_step: dict[int, Path] = {}
    for path in sorted(Path(directory).glob("*.ckpt"), key=lambda p: p.stat().st_mtime):
        checkpoint = _load(path)
        if "averaged_from" not in checkpoint:
            by_step[int(checkpoint.get("global_step", -1))] = path
    if len(by_step) < n:
        raise AveragingError(
            f"{directory} has {len(by_step)} checkpoints of distinct steps, fewer than {n}: "
            "save one per validation with callbacks.model_checkpoint.save_top_k=-1 "
            "\"callbacks.model_checkpoint.filename='step{step}'\""
        )
    return [by_step[step] for step in sorted(by_step)[-n:]]


def save(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write atomically (a crash never leaves a half-written file at `path`)."""
    AtomicCheckpointIO().save_checkpoint(checkpoint, path)


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
        self.snapshots: deque[tuple[int, dict[str, Tensor]]] = deque(maxlen=last)

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if self.snapshots and self.snapshots[-1][0] == step:
            return
        state = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()}
        self.snapshots.append((step, state))

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
        self._snapshot(trainer, pl_module)
        current = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        pl_module.load_state_dict(average_state_dicts([s for _, s in self.snapshots]))
        path = self.path(trainer)
        trainer.save_checkpoint(path, weights_only=True)
        pl_module.load_state_dict(current)
        if trainer.is_global_zero:  # mark it, so that `--last N` never counts it
            checkpoint = _load(path)
            checkpoint["averaged_from"] = [f"step {step}" for step, _ in self.snapshots]
            save(checkpoint, path)

    def path(self, trainer: L.Trainer) -> Path:
        """`dirpath/filename`; dirpath defaults to the ModelCheckpoint's, else
        `<default_root_dir>/checkpoints`."""
        directory = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None)
        return Path(directory or Path(trainer.default_root_dir) / "checkpoints") / self.filename


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m aiayn.averaging",
        description="Average the weights of checkpoints into one loadable checkpoint.",
    )
    parser.add_argument("inputs", nargs="+", help="checkpoints, or one directory with --last")
    parser.add_argument("--last", type=int, help="average the N newest checkpoints of a directory")
    parser.add_argument("-o", "--output", required=True, help="the averaged .ckpt to write")
    args = parser.parse_args(argv)
    try:
        if args.last is not None:
            if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
                parser.error("--last N takes one directory of checkpoints")
            paths = last_checkpoints(args.inputs[0], args.last)
        else:
            paths = [Path(p) for p in args.inputs]
        save(average_checkpoints(paths), args.output)
    except AveragingError as error:
        sys.exit(f"error: {error}")
    print(f"averaged {len(paths)} checkpoints -> {args.output}")
    for path in paths:
        print(f"  {path}")


if __name__ == "__main__":
    main()
