"""Checkpoint averaging on files (the paper averages the last 5 (base) or 20 (big)
checkpoints); the command is `python -m aiayn.averaging` (aiayn.cli.average), the callback
`aiayn.callbacks.AverageCheckpoints`.

The averaged checkpoint is the newest input's (hyper-parameters, tokenizer) with the mean
weights (floating tensors; others are taken from the newest) and without optimizer state: it
loads, evaluates and translates like any other, but does not resume training.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import AveragingError
from aiayn.inference.checkpoint import nonfinite_weight, read_checkpoint
from aiayn.model.config import ModelConfig

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "callbacks")


def _aliases(state: dict[str, Tensor]) -> dict[str, str]:
    """key -> the first key holding the very same tensor view, for every later such key (tied
    weights: the source and target embeddings and the output layer share one matrix)."""
    seen: dict[tuple, str] = {}
    aliases = {}
    for key, value in state.items():
        view = (
            value.untyped_storage().data_ptr(),
            value.storage_offset(),
            value.shape,
            value.stride(),
            value.dtype,
        )
        if value.numel() and view in seen:
            aliases[key] = seen[view]
        else:
            seen[view] = key
    return aliases


def average_state_dicts(states: Iterable[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Elementwise mean of the floating-point tensors (summed in float64, cast back to each
    tensor's dtype); non-floating tensors are taken from the last state. Keys and shapes must
    agree with the first state's. `states` may be a generator: the sums and one state are all
    that is held, so averaging N snapshots from disk needs memory for 3 of them, not N. Keys
    that hold one tensor in every state (tied weights) are summed once and share one tensor in
    the mean, as they do in the model."""
    totals: dict[str, Tensor] = {}
    first: dict[str, tuple[int, ...]] = {}
    aliases: dict[str, str] = {}
    last: dict[str, Tensor] = {}
    count = 0
    for i, state in enumerate(states):
        if not first:
            first = {key: tuple(value.shape) for key, value in state.items()}
            aliases = _aliases(state)
        elif state.keys() != first.keys():
            diff = sorted(set(state) ^ set(first))
            raise AveragingError(f"state {i} differs in keys from state 0: {diff[:5]}")
        else:  # a tie this state does not have: the key's sum so far is its first key's
            ties = _aliases(state)
            for key in [k for k, of in aliases.items() if ties.get(k) != of]:
                if aliases[key] in totals:
                    totals[key] = totals[aliases[key]].clone()
                del aliases[key]
        for key, value in state.items():
            if tuple(value.shape) != first[key]:
                raise AveragingError(
                    f"{key}: shape {tuple(value.shape)} in state {i} but {first[key]} in state 0"
                )
            if not value.is_floating_point() or key in aliases:
                continue
            if key in totals:
                totals[key] += value
            else:
                totals[key] = value.to(torch.float64, copy=True)
        last, count = state, count + 1
    if not count:
        raise AveragingError("nothing to average: no checkpoints given")
    out = {
        key: (totals[key] / count).to(value.dtype) if value.is_floating_point() else value.clone()
        for key, value in last.items()
        if key not in aliases
    }
    return {key: out[aliases.get(key, key)] for key in last}


def _model_hyper_parameters(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's model hyper-parameters, ModelConfig's defaults filled in for fields
    added after it was written (a run resumed across such a release keeps averaging)."""
    model = checkpoint.get("hyper_parameters", {}).get("model")
    return None if model is None else {**asdict(ModelConfig()), **model}


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The checkpoint with the mean weights of `paths` (all must have the same model
    hyper-parameters); hyper-parameters, tokenizer and metadata come from the last path."""
    checkpoints = [read_checkpoint(p) for p in paths]
    if not checkpoints:
        raise AveragingError("nothing to average: no checkpoints given")
    newest = checkpoints[-1]
    model = _model_hyper_parameters(newest)
    for path, checkpoint in zip(paths, checkpoints, strict=True):
        if _model_hyper_parameters(checkpoint) != model:
            raise AveragingError(
                f"{path} has other model hyper-parameters than {paths[-1]}; average "
                "checkpoints of one run"
            )
        bad = nonfinite_weight(checkpoint.get("state_dict") or {})
        if bad is not None:
            raise AveragingError(
                f"{path}: weight {bad} holds NaN or infinity (a diverged run): the average "
                "would too; leave it out"
            )
    out = {k: v for k, v in newest.items() if k not in TRAINING_STATE}
    out["state_dict"] = average_state_dicts([c["state_dict"] for c in checkpoints])
    out["averaged_from"] = [str(p) for p in paths]
    return out


def last_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The `n` checkpoints of `directory` with the highest global steps, oldest first."""
    if n < 1:  # a slice [-0:] would take them all, [-(-1):] all but the oldest
        raise AveragingError(
            f"--last must be at least 1 (the newest checkpoints to average), got {n}"
        )
    by_step: dict[int, Path] = {}
    for path in sorted(Path(directory).glob("*.ckpt"), key=lambda p: p.stat().st_mtime):
        checkpoint = read_checkpoint(path)
        if "averaged_from" not in checkpoint:
            by_step[int(checkpoint.get("global_step", -1))] = path
    if len(by_step) < n:
        raise AveragingError(
            f"{directory} has {len(by_step)} checkpoints of distinct steps, fewer than {n}: "
            "save one per validation with callbacks.model_checkpoint.save_top_k=-1 "
            "\"callbacks.model_checkpoint.filename='step{step}'\""
        )
    return [by_step[step] for step in sorted(by_step)[-n:]]
