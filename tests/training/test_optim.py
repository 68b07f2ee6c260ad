"""The learning-rate schedules and optimizer settings."""

import math

import pytest
import torch

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
    ],
)
def test_invalid_optim_config_names_the_key(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        OptimConfig(**kwargs)
