"""The learning-rate schedules and optimizer settings."""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer

from aiayn.training.schedules import OptimConfig, inverse_sqrt, lr_multiplier, noam


def test_noam_matches_the_paper_formula_and_peaks_at_warmup():
    d, w = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        expected = d**-0.5 * min(step**-0.5, step * w**-1.5)
        assert noam(step, w, d) == pytest.approx(expected, rel=1e-12)
    rates = [noam(s, w, d) for s in range(1, 20_000, 7)]
    peak_step = 1 + 7 * max(range(len(rates)), key=rates.__getitem__)
    assert abs(peak_step - w) <= 7
    assert noam(w, w, d) == pytest.approx(d**-0.5 * w**-0.5)


def test_inverse_sqrt_warms_up_linearly_then_decays():
    assert inverse_sqrt(1, 100) == pytest.approx(0.01)
    assert inverse_sqrt(50, 100) == pytest.approx(0.5)
    assert inverse_sqrt(100, 100) == pytest.approx(1.0)
    assert inverse_sqrt(400, 100) == pytest.approx(0.5)


@pytest.mark.parametrize("schedule", ["noam", "inverse_sqrt", "constant"])
def test_warmup_start_factor_lifts_the_ramp_and_keeps_the_decay(schedule):
    ramp = OptimConfig(schedule=schedule, lr=1.0, warmup_steps=100)
    flat = OptimConfig(schedule=schedule, lr=1.0, warmup_steps=100, warmup_start_factor=1.0)
    half = OptimConfig(schedule=schedule, lr=1.0, warmup_steps=100, warmup_start_factor=0.5)
    f_ramp, f_flat, f_half = (lr_multiplier(c, 64) for c in (ramp, flat, half))
    peak = f_ramp(99)  # update 100, the end of the warmup
    assert f_ramp(0) == pytest.approx(peak / 100)
    # no ramp: the peak from the first update, the same schedule from the end of the warmup
    assert [f_flat(i) for i in (0, 10, 50)] == pytest.approx([peak] * 3)
    assert f_half(0) == pytest.approx(peak * (0.5 + 0.5 / 100))
    assert f_half(49) == pytest.approx(peak * 0.75)
    for i in (99, 150, 399, 5000):
        assert f_flat(i) == pytest.approx(f_ramp(i)) == pytest.approx(f_half(i))


def test_scheduler_steps_per_update_with_the_configured_base_lr():
    cfg = OptimConfig(schedule="noam", lr=2.0, warmup_steps=10)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([param], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(cfg, 64))
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[0] == pytest.approx(2.0 * noam(1, 10, 64))
    assert seen[9] == pytest.approx(2.0 * 64**-0.5 * 10**-0.5)
    assert seen[19] == pytest.approx(2.0 * 64**-0.5 / math.sqrt(20))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"schedule": "cosine"}, "optim.schedule"),
        ({"lr": 0.0}, "optim.lr"),
        ({"warmup_start_factor": 1.5}, "optim.warmup_start_factor"),
        ({"warmup_steps": -1}, "optim.warmup_steps"),
        ({"schedule": "noam", "warmup_steps": 0}, "optim.warmup_steps"),
        ({"betas": [0.9]}, "optim.betas"),
        ({"eps": 0.0}, "optim.eps"),
        ({"label_smoothing": 1.0}, "optim.label_smoothing"),
        ({"cooldown": 1.5}, "optim.cooldown"),
    ],
)
def test_invalid_optim_config_names_the_key(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        OptimConfig(**kwargs)


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "constant"])
def test_cooldown_decays_the_schedule_linearly_to_zero_over_the_budgets_last_share(schedule):
    """optim.cooldown=0.25 of a 100-update budget: the schedule itself for 75 updates, then
    times a line that reaches zero after the last update."""
    plain = lr_multiplier(OptimConfig(schedule=schedule, lr=1.0, warmup_steps=10), 64)
    cooled = lr_multiplier(
        OptimConfig(schedule=schedule, lr=1.0, warmup_steps=10, cooldown=0.25),
        64,
        budget_spent=lambda done: done / 100,
    )
    for i in (0, 5, 50, 75):  # i updates done: the rate of update i + 1
        assert cooled(i) == pytest.approx(plain(i))
    for i, left in ((80, 0.8), (90, 0.4), (99, 0.04)):
        assert cooled(i) == pytest.approx(plain(i) * left)
    assert cooled(100) == cooled(130) == 0.0  # past the budget (a step budget's overshoot)


def test_cooldown_needs_a_budget():
    with pytest.raises(ValueError, match="budget"):
        lr_multiplier(OptimConfig(schedule="constant", cooldown=0.5), 64)


class RateLog(L.Callback):
    """The learning rate of each update, and the timer's clock just before and after it."""

    def __init__(self) -> None:
        self.rates, self.before, self.after = [], [], []

    @staticmethod
    def _clock(trainer) -> float:
        timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
        return timers[0].time_elapsed() if timers else 0.0

    def on_train_batch_start(self, trainer, pl_module, *args) -> None:
        self.rates.append(trainer.optimizers[0].param_groups[0]["lr"])
        self.before.append(self._clock(trainer))

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.after.append(self._clock(trainer))


def _fit_with_cooldown(tmp_path, **trainer_kwargs) -> RateLog:
    """The tiny toy model through a real Trainer with a constant rate of 1e-3 and
    optim.cooldown=0.5."""
    from aiayn.training.run import build, validate
    from tests.helpers import compose_train, fast_overrides

    overrides = ["optim.schedule=constant", "optim.warmup_steps=0", "optim.lr=1e-3"]
    toy = ["data.toy.train_size=400", "data.toy.val_size=10", "data.toy.test_size=10"]
    cfg = compose_train(
        [*fast_overrides(tmp_path), *toy, *overrides, "optim.cooldown=0.5"], tmp_path
    )
    datamodule, module = build(validate(cfg))
    log = RateLog()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[log],
        **trainer_kwargs,
    )
    trainer.fit(module, datamodule=datamodule)
    return log


def test_a_step_budget_cools_down_over_its_last_half(tmp_path):
    log = _fit_with_cooldown(tmp_path, max_steps=6)
    assert log.rates == pytest.approx([1e-3] * 4 + [1e-3 * 2 / 3, 1e-3 / 3])


def test_a_time_budget_cools_down_by_the_clock(tmp_path):
    """trainer.max_time of 3 s, no step or epoch limit: each update's rate is the line at the
    clock reading when the scheduler stepped after the previous update, which lies between the
    readings at the two updates' starts."""
    log = _fit_with_cooldown(tmp_path, max_steps=-1, max_epochs=-1, max_time={"seconds": 3})
    assert len(log.rates) >= 5 and log.after[-1] >= 3.0
    line = [min(1.0, max(0.0, (1 - t / 3) / 0.5)) * 1e-3 for t in log.before]
    assert log.rates[0] == pytest.approx(1e-3)
    for i, rate in enumerate(log.rates[1:], start=1):
        assert line[i] - 1e-9 <= rate <= line[i - 1] + 1e-9, (i, rate)
    assert log.rates[-1] < 0.5e-3  # the last updates run below half the peak


@pytest.mark.parametrize("timer", [False, True])
def test_epochs_of_unknown_length_cool_down_by_the_clock_or_are_refused(tmp_path, timer):
    """Lightning's estimated_stepping_batches is -1 for max_epochs over a loader of unknown
    length: the share comes from trainer.max_time alone, or, without one, the run is refused
    with the keys to set (not a negative share, nor a cooldown that never comes)."""
    from types import SimpleNamespace

    from aiayn.errors import ConfigError
    from aiayn.training.run import build, validate
    from tests.helpers import compose_train, fast_overrides

    cfg = compose_train([*fast_overrides(tmp_path), "optim.cooldown=0.5"], tmp_path)
    _, module = build(validate(cfg))
    clock = Timer(duration={"seconds": 10})
    clock.time_elapsed = lambda *a: 7.5  # 3/4 of the budget spent
    clock.time_remaining = lambda *a: 2.5
    module._trainer = SimpleNamespace(
        estimated_stepping_batches=-1,
        callbacks=[clock] if timer else [],
        strategy=SimpleNamespace(broadcast=lambda x: x),
    )
    if not timer:
        with pytest.raises(ConfigError, match=r"trainer\.max_steps or trainer\.max_time"):
            module._budget_spent()
        return
    assert module._budget_spent()(3) == pytest.approx(0.75)
