"""The loss of an update is normalised by the target tokens of the whole update (fairseq's
semantics): micro-batches of unequal fill under gradient accumulation, and under gloo DDP,
give the gradient of the per-token mean over all of their tokens, as one big batch does."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from aiayn.data.dataset import Batch, collate
from aiayn.training.module import TranslationModule
from tests.model.model_helpers import tiny_config

MODEL = dataclasses.asdict(tiny_config())
OPTIM = {"schedule": "constant", "lr": 1e-3, "warmup_steps": 0, "label_smoothing": 0.1}
DECODE = {"strategy": "greedy"}


def batches() -> list[Batch]:
    """Two batches of very different fill: 2 short pairs, 6 long ones."""
    rng = random.Random(0)

    def pair(i: int, n: int) -> tuple[int, list[int], list[int]]:
        return i, [rng.randrange(4, 23) for _ in range(n)], [rng.randrange(4, 23) for _ in range(n)]

    small = collate([pair(0, 2), pair(1, 3)])
    large = collate([pair(2 + i, 9 + i % 3) for i in range(6)])
    return [small, large]


def _as_is(batch: Batch) -> Batch:
    return batch


class GradientCapture(TranslationModule):
    """Writes this rank's gradients, as the optimizer will see them, to `<out>/grads<rank>.pt`
    at the first update; rank r trains on batch r (so DDP ranks see different fills)."""

    out: Path

    def train_dataloader(self) -> DataLoader:
        data = batches()
        data = data if self.trainer.world_size == 1 else [data[self.global_rank]]
        return DataLoader(data, batch_size=None, collate_fn=_as_is)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        grads = {n: p.grad.clone() for n, p in self.named_parameters() if p.grad is not None}
        torch.save(grads, self.out / f"grads{self.global_rank}.pt")


def module(out: Path) -> GradientCapture:
    torch.manual_seed(0)
    m = GradientCapture(MODEL, OPTIM, DECODE, val_bleu=False)
    m.out = out
    return m


def reference_gradients() -> dict[str, torch.Tensor]:
    """The gradient of the label-smoothed loss's mean over every target token of both
    batches, computed directly."""
    m = module(Path("."))
    total, tokens = 0.0, 0
    for batch in batches():
        loss, _ = m.losses(batch)
        n = int(batch.tgt_out.ne(0).sum())
        total, tokens = total + loss * n, tokens + n
    (total / tokens).backward()
    return {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


def fit(out: Path, **trainer: object) -> None:
    kwargs = dict(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    L.Trainer(**(kwargs | trainer)).fit(module(out))


def assert_equal_to_reference(grads: dict[str, torch.Tensor]) -> None:
    reference = reference_gradients()
    assert grads.keys() == reference.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-7, msg=name)


def test_the_batches_differ_in_fill():
    small, large = batches()
    assert int(large.tgt_out.ne(0).sum()) > 5 * int(small.tgt_out.ne(0).sum())


@pytest.mark.parametrize("unit", [None, 7.0, 4096.0])
def test_accumulated_unequal_batches_give_the_big_batch_gradient(tmp_path, monkeypatch, unit):
    """Whatever the token unit each micro-batch's loss is weighed by (none: one token; the
    data's budget, as `data.max_tokens` gives it), the update's gradient is the one of its
    per-token mean."""
    if unit is not None:
        monkeypatch.setattr(TranslationModule, "_token_unit", lambda self: unit)
    fit(tmp_path, accumulate_grad_batches=2)
    assert_equal_to_reference(torch.load(tmp_path / "grads0.pt"))
    # the per-batch mean averaged over the two batches (the old semantics) differs
    m = module(tmp_path)
    (sum(m.losses(b)[0] for b in batches()) / 2).backward()
    reference = reference_gradients()
    differ = [n for n, p in m.named_parameters() if not torch.allclose(p.grad, reference[n])]
    assert len(differ) > len(reference) // 2


@pytest.mark.slow
def test_ddp_ranks_with_unequal_batches_give_the_big_batch_gradient(tmp_path):
    fit(tmp_path, devices=2, strategy="ddp_spawn")
    for rank in (0, 1):
        assert_equal_to_reference(torch.load(tmp_path / f"grads{rank}.pt"))
