"""`UpdateGuard`: skip an update whose gradients are not finite, count it, and stop a run that
keeps diverging, without waiting on the device in the training step.

Everything the guard keeps is a 0-dim tensor on the gradients' device, updated by tensor
operations; the fused optimizer skips an update on the device through its `found_inf` input
(what a GradScaler gives it), so no update waits for the host to read a norm. The host reads
the guard only in `check`, which `TranslationModule` calls where Lightning reads the logged
metrics anyway (every `trainer.log_every_n_steps` updates, before each validation and at the
end of training). A run that crossed the limit between two checks has its later updates
skipped too, so its weights stay those of the update where it crossed.

Under a GradScaler (`16-mixed`) a non-finite update is first the scaler's: it skips it and
halves its scale. Such an update is counted in `train/skipped_updates` always, and towards
`optim.max_nonfinite_updates` only once the scale it ran at is at or below
`optim.min_loss_scale` (fairseq's `--min-loss-scale`): above it, a scaler that is still
searching for its scale is not a diverging run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.errors import DivergedError


@dataclass
class Divergence:
    """What the host reads of the guard when the limit was crossed."""

    in_row: int
    step: int
    lr: float
    last_finite_step: int
    last_finite_loss: float | None


class UpdateGuard:
    """Counters of non-finite updates, on `device` (created at the first update)."""

    def __init__(self, limit: int, min_loss_scale: float) -> None:
        self.limit, self.min_loss_scale = limit, min_loss_scale
        self._state: dict[str, Tensor] | None = None

    def _tensors(self, device: torch.device) -> dict[str, Tensor]:
        if self._state is None:
            zero = torch.zeros((), device=device)
            self._state = {
                "skipped": zero.clone(),  # all skipped updates
                "in_row": zero.clone(),  # counted non-finite updates in a row
                "crossed_step": zero - 1,  # the update where in_row first passed the limit
                "crossed_in_row": zero.clone(),
                "crossed_lr": zero.clone(),
                "last_step": zero.clone(),  # the last finite update and its loss
                "last_loss": torch.full((), float("nan"), device=device),
            }
        return self._state

    @property
    def skipped(self) -> Tensor | None:
        """Skipped updates so far (a device tensor; None before the first update)."""
        return None if self._state is None else self._state["skipped"]

    def diverged(self, device: torch.device) -> Tensor:
        """Whether the limit was crossed (bool, on `device`): every later update is skipped."""
        return self._tensors(device)["crossed_step"] >= 0

    def observe(
        self, norm: Tensor, step: int, loss: Tensor | None, lr: float, scale: Tensor | None
    ) -> Tensor:
        """Record the update `step` whose gradient norm is `norm` (its loss `loss`, learning
        rate `lr`; `scale`: the GradScaler's scale it ran at, None without one); returns
        whether it is to be skipped (bool, on the norm's device)."""
        state = self._tensors(norm.device)
        nonfinite = ~torch.isfinite(norm)
        counts = nonfinite if scale is None else nonfinite & (scale <= self.min_loss_scale)
        crossed = state["crossed_step"] >= 0
        state["skipped"] += nonfinite | crossed
        state["in_row"] = torch.where(nonfinite, state["in_row"] + counts, 0.0)
        finite = ~nonfinite & ~crossed
        state["last_step"] = torch.where(finite, step, state["last_step"])
        if loss is not None:
            state["last_loss"] = torch.where(finite, loss.float(), state["last_loss"])
        crossing = ~crossed & (state["in_row"] > self.limit)
        state["crossed_step"] = torch.where(crossing, step, state["crossed_step"])
        state["crossed_in_row"] = torch.where(crossing, state["in_row"], state["crossed_in_row"])
        state["crossed_lr"] = torch.where(crossing, lr, state["crossed_lr"])
        return nonfinite | crossed | crossing

    def divergence(self) -> Divergence | None:
        """What the host needs to stop the run (this reads the device), or None."""
        if self._state is None:
            return None
        values = {k: v.item() for k, v in self._state.items()}
        if values["crossed_step"] < 0:
            return None
        loss = values["last_loss"]
        return Divergence(
            in_row=int(values["crossed_in_row"]),
            step=int(values["crossed_step"]),
            lr=values["crossed_lr"],
            last_finite_step=int(values["last_step"]),
            last_finite_loss=None if loss != loss else loss,
        )

    def check(self) -> None:
        """Raise `DivergedError` when the limit was crossed (reads the device)."""
        seen = self.divergence()
        if seen is None:
            return
        last = (
            f"{seen.last_finite_loss:.4g} at update {seen.last_finite_step}"
            if seen.last_finite_loss is not None
            else "never finite"
        )
        raise DivergedError(
            f"training diverged: {seen.in_row} updates in a row up to update {seen.step} had "
            f"non-finite gradients (more than optim.max_nonfinite_updates={self.limit}); "
            f"learning rate {seen.lr:.3g}, last finite loss {last}. Lower optim.lr or lengthen "
            "optim.warmup_steps; no checkpoint with non-finite weights was written"
        )
