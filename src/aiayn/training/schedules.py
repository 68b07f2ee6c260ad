"""Optimizer settings and the learning-rate schedules (pure functions of the update count,
times an optional cooldown over the end of the training budget).

The paper (Section 5.3): Adam(β1=0.9, β2=0.98, ε=1e-9) and
lr = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), stepped once per optimizer update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

SCHEDULES = ("noam", "inverse_sqrt", "constant")


@dataclass
class OptimConfig:
    """Optimizer and schedule (Hydra group `optim`).

    schedule 'noam': lr = lr · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) (paper: lr 1).
    schedule 'inverse_sqrt': linear warmup to `lr`, then lr · sqrt(warmup / step) (fairseq).
    schedule 'constant': linear warmup to `lr`, then `lr`.
    The warmup ramp starts at `warmup_start_factor` x the peak (0: from zero; 1: no ramp, the
    peak from the first update and the same decay after `warmup_steps`; torch's
    LinearLR.start_factor).
    `cooldown` > 0 multiplies any of them by a linear decay to zero over the last `cooldown`
    share of the training budget (trainer.max_steps, max_epochs or max_time, whichever ends
    first): warmup-stable-decay (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
    Training Beyond Fixed Training Durations"). Under max_time the rate follows rank 0's
    clock, read at log steps and estimated alike on every rank between them
    (`aiayn.callbacks.SyncedTimer`).
    """

    schedule: str = "noam"
    lr: float = 1.0
    warmup_steps: int = 4000
    warmup_start_factor: float = 0.0
    cooldown: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    # an update whose gradients are not finite is skipped (and counted in
    # train/skipped_updates); more than this many in a row stop the run
    max_nonfinite_updates: int = 5
    # 16-mixed: a GradScaler skips an overflowing update and halves its scale; such updates
    # count towards max_nonfinite_updates only once the scale is at or below this (fairseq's
    # --min-loss-scale): above it the scaler is still searching, the run is not diverging
    min_loss_scale: float = 1e-4

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r} is unknown; use one of {SCHEDULES}")
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(
                f"optim.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}"
            )
        if self.schedule == "noam" and self.warmup_steps == 0:
            raise ValueError("optim.warmup_steps must be positive for the 'noam' schedule")
        if not 0.0 <= self.warmup_start_factor <= 1.0:
            raise ValueError(
                f"optim.warmup_start_factor must lie in [0, 1], got {self.warmup_start_factor!r}"
            )
        if not 0.0 <= self.cooldown <= 1.0:
            raise ValueError(f"optim.cooldown must lie in [0, 1], got {self.cooldown!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)!r}")
        if not self.eps > 0:
            raise ValueError(f"optim.eps must be positive, got {self.eps!r}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay!r}")
        if not isinstance(self.max_nonfinite_updates, int) or self.max_nonfinite_updates < 0:
            raise ValueError(
                "optim.max_nonfinite_updates must be an integer >= 0, got "
                f"{self.max_nonfinite_updates!r}"
            )
        if not self.min_loss_scale > 0:
            raise ValueError(f"optim.min_loss_scale must be positive, got {self.min_loss_scale!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(
                f"optim.label_smoothing must lie in [0, 1), got {self.label_smoothing!r}"
            )


def _ramp(step: int, warmup: int, start: float) -> float:
    """The warmup ramp at update `step` (1-based) as a fraction of the peak: linear from
    `start` to 1 over `warmup` updates."""
    return start + (1.0 - start) * min(1.0, step / warmup)


def noam(step: int, warmup: int, d_model: int, start: float = 0.0) -> float:
    """The paper's rate at update `step` (1-based):
    d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) (`start` > 0 lifts the ramp)."""
    step = max(step, 1)
    if step < warmup:
        return d_model**-0.5 * warmup**-0.5 * _ramp(step, warmup, start)
    return d_model**-0.5 * step**-0.5


def inverse_sqrt(step: int, warmup: int, start: float = 0.0) -> float:
    """Multiplier: linear warmup to 1 over `warmup` updates, then sqrt(warmup / step)."""
    step = max(step, 1)
    if step < warmup:
        return _ramp(step, warmup, start)
    return math.sqrt(max(warmup, 1) / step)


def constant(step: int, warmup: int, start: float = 0.0) -> float:
    """Multiplier: linear warmup to 1 over `warmup` updates, then 1."""
    step = max(step, 1)
    return _ramp(step, warmup, start) if warmup > 0 else 1.0


def cooldown(spent: float, share: float) -> float:
    """Multiplier: 1 until the last `share` of the budget, then linear to 0 at its end
    (`spent`: the share of the budget used so far; `share` 0: no cooldown)."""
    if share <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - spent) / share))


def lr_multiplier(
    config: OptimConfig, d_model: int, budget_spent: Callable[[int], float] | None = None
) -> Callable[[int], float]:
    """`LambdaLR` factor for `config`: maps the 0-based update count to lr / config.lr.
    `budget_spent(done)`: the share of the training budget that `done` updates used (needed
    when config.cooldown > 0)."""
    start, warmup = config.warmup_start_factor, config.warmup_steps
    base = {
        "noam": partial(noam, warmup=warmup, d_model=d_model, start=start),
        "inverse_sqrt": partial(inverse_sqrt, warmup=warmup, start=start),
        "constant": partial(constant, warmup=warmup, start=start),
    }[config.schedule]
    if config.cooldown == 0:
        return lambda i: base(i + 1)
    if budget_spent is None:
        raise ValueError("optim.cooldown > 0 needs the training budget (budget_spent)")
    return lambda i: base(i + 1) * cooldown(budget_spent(i), config.cooldown)
