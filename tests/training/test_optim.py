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


def _ranks_under_a_synced_timer(monkeypatch, paces: list[float], updates: int) -> dict:
    """SyncedTimers of `len(paces)` ranks whose clocks run `paces[r]` seconds per update,
    stepped in lockstep over `updates` updates of a 10 s budget (log steps: every 4th
    update); rank 0's broadcasts reach every rank. Returns each rank's cooldown share after
    every update, the update each stopped at, and the updates whose start broadcast."""
    from types import SimpleNamespace

    from aiayn.callbacks import timer as timer_module
    from aiayn.callbacks.timer import SyncedTimer

    monkeypatch.setattr(timer_module, "sync_step", lambda t: (t.global_step + 1) % 4 == 0)
    ranks = range(len(paces))
    clocks = [0.0 for _ in ranks]
    sent: list = []  # rank 0's broadcasts, in order
    read_at: list[int] = []

    def broadcast(rank: int, trainer):
        def give(obj):
            if rank == 0:
                sent.append(obj)
                read_at.append(trainer.global_step + 1)
            return sent[-1]

        return give

    trainers, timers = [], []
    for rank in ranks:
        trainer = SimpleNamespace(
            global_step=0,
            accumulate_grad_batches=1,
            is_last_batch=False,
            should_stop=False,
            world_size=len(paces),
        )
        trainer.strategy = SimpleNamespace(broadcast=broadcast(rank, trainer))
        timer = SyncedTimer(duration={"seconds": 10}, verbose=False)
        timer.time_elapsed = lambda *a, r=rank: clocks[r]
        timer.setup(trainer, None, "fit")
        timer._read(trainer, pace=False)  # on_train_start
        trainers.append(trainer)
        timers.append(timer)
    shares = {rank: [] for rank in ranks}
    stopped = {rank: None for rank in ranks}
    for update in range(1, updates + 1):
        for rank in ranks:
            trainer = trainers[rank]
            trainer.global_step = update - 1
            timers[rank].on_train_batch_start(trainer, None, None, update - 1)
            if trainer.should_stop and stopped[rank] is None:
                stopped[rank] = update
            clocks[rank] += paces[rank]
            trainer.global_step = update
            shares[rank].append(timers[rank].budget_share(update))
    return {"shares": shares, "stopped": stopped, "read_at": read_at[1:]}


def test_every_rank_follows_rank_zeros_clock_read_at_log_steps_only(monkeypatch):
    """Two ranks whose clocks disagree (rank 1's runs slower) read rank 0's at the starts
    of the log steps only and estimate it alike between them (from its pace): every rank has
    the same cooldown share after every update and stops at the same update, the one whose
    end reaches the 10 s budget by rank 0's clock, as Lightning's Timer would."""
    seen = _ranks_under_a_synced_timer(monkeypatch, [1.0, 1.3], updates=12)
    assert seen["read_at"] == [4, 8, 12]  # the log updates' starts; none between them
    assert seen["shares"][0] == seen["shares"][1]
    # no pace is known before the first log step (a resumed run has its checkpoint's)
    assert seen["shares"][0][:9] == pytest.approx([0.0] * 3 + [u / 10 for u in range(4, 10)])
    assert seen["stopped"] == {0: 10, 1: 10}


def test_one_process_reads_its_own_clock_every_update(monkeypatch):
    """In one process nothing is broadcast: the cooldown's share is the clock itself and the
    update whose end the last update's pace puts at the budget is the last."""
    seen = _ranks_under_a_synced_timer(monkeypatch, [1.25], updates=9)
    assert seen["shares"][0] == pytest.approx([min(1.0, 1.25 * u / 10) for u in range(1, 10)])
    assert seen["stopped"] == {0: 8}


def test_the_cooldown_under_a_synced_timer_costs_no_collective(tmp_path):
    """`_budget_spent` takes the synced clock's share as it is: no broadcast (the strategy
    here has none)."""
    from types import SimpleNamespace

    from aiayn.callbacks.timer import SyncedTimer
    from aiayn.training.run import build, validate
    from tests.helpers import compose_train, fast_overrides

    cfg = compose_train([*fast_overrides(tmp_path), "optim.cooldown=0.5"], tmp_path)
    _, module = build(validate(cfg))
    clock = SyncedTimer(duration={"seconds": 10})
    clock._shared, clock._read_at, clock._read_step, clock._pace = True, 6.0, 4, 0.5
    module._trainer = SimpleNamespace(
        estimated_stepping_batches=100, callbacks=[clock], strategy=SimpleNamespace()
    )
    spent = module._budget_spent()
    assert spent(4) == pytest.approx(0.6) and spent(8) == pytest.approx(0.8)
    clock._pace = 0.0
    assert spent(90) == pytest.approx(0.9)  # the step budget, where it is the larger share
