"""TokenBatchSampler: token budget, equal DDP shards, determinism, exact resume."""

from itertools import islice

import numpy as np
import pytest

from aiayn.data.sampler import TokenBatchSampler
from aiayn.errors import DataError

RNG = np.random.default_rng(0)
SRC = RNG.integers(1, 60, size=2000)
TGT = np.clip(SRC + RNG.integers(-5, 6, size=2000), 1, None)
WIDTH = np.maximum(SRC, TGT) + 1


def make(**kwargs: object) -> TokenBatchSampler:
    settings: dict[str, object] = {"max_tokens": 512, "shuffle": True, "seed": 3}
    settings.update(kwargs)
    return TokenBatchSampler(SRC, TGT, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("shuffle", [True, False])
def test_budget_and_cover(shuffle: bool) -> None:
    batches = list(make(shuffle=shuffle))
    assert all(len(b) * WIDTH[b].max() <= 512 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(2000))
    assert len(batches) == len(make(shuffle=shuffle))


def test_shards_are_equal_and_cover_everything() -> None:
    for epoch in (0, 1):
        shards = []
        for rank in range(3):
            sampler = make(rank=rank, world_size=3)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
            assert len(shards[-1]) == len(sampler)
        assert len({len(shard) for shard in shards}) == 1
        assert sorted(i for shard in shards for b in shard for i in b) == list(range(2000))
    eval_shards = [list(make(shuffle=False, rank=r, world_size=3)) for r in range(3)]
    assert len({len(shard) for shard in eval_shards}) == 1
    assert sorted(i for shard in eval_shards for b in shard for i in b) == list(range(2000))


def test_fewer_examples_than_ranks_repeat() -> None:
    shards = [
        list(TokenBatchSampler([3, 4], [5, 2], 64, False, rank=r, world_size=3)) for r in range(3)
    ]
    assert [len(shard) for shard in shards] == [1, 1, 1]
    assert {i for shard in shards for b in shard for i in b} == {0, 1}


def test_deterministic_per_epoch_and_shuffled_between_epochs() -> None:
    a, b = make(), make()
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert list(make(seed=4)) != first
    assert list(make(shuffle=False)) == list(make(shuffle=False, seed=9))


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_yields_exactly_the_rest(world_size: int) -> None:
    run = make(rank=world_size - 1, world_size=world_size)
    run.set_epoch(2)
    uninterrupted = list(run)
    interrupted = make(rank=world_size - 1, world_size=world_size)
    interrupted.set_epoch(2)
    assert list(islice(iter(interrupted), 5)) == uninterrupted[:5]
    state = interrupted.state_dict()
    assert state == {"epoch": 2, "position": 5, "world_size": world_size, "batches": len(run)}
    resumed = make(rank=world_size - 1, world_size=world_size)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # what Lightning does at the start of the (same) epoch
    assert list(resumed) == uninterrupted[5:]
    resumed.set_epoch(3)
    run.set_epoch(3)
    assert list(resumed) == list(run)  # the next epoch starts from the beginning


def test_a_position_mid_epoch_is_refused_under_another_world_size() -> None:
    """Rank r's position p means the first p x world_size batches of the epoch: under another
    world size the shards differ, so resuming mid-epoch is refused; at an epoch end (and from
    a state saved before the world size was) there is nothing to misplace."""
    stopped = make(rank=0, world_size=2)
    next(iter(stopped))
    state = stopped.state_dict()
    with pytest.raises(DataError, match="with 2 processes; its data position cannot continue"):
        make().load_state_dict(state)
    make(rank=1, world_size=2).load_state_dict(state)  # the same world size
    for finished in ({**state, "position": state["batches"]}, {"epoch": 0, "position": 1}):
        make(rank=2, world_size=3).load_state_dict(finished)


def test_rank_must_be_in_world() -> None:
    with pytest.raises(ValueError, match="rank 2"):
        make(rank=2, world_size=2)


def _greedy(widths: np.ndarray, order: np.ndarray, max_tokens: int) -> list[list[int]]:
    """The batching rule, one example at a time: add to the batch while (size + 1) x its
    widest example fits, else start a new one."""
    batches: list[list[int]] = []
    batch: list[int] = []
    widest = 0
    for i in order.tolist():
        if batch and (len(batch) + 1) * max(widest, int(widths[i])) > max_tokens:
            batches.append(batch)
            batch, widest = [], 0
        batch.append(i)
        widest = max(widest, int(widths[i]))
    return [*batches, batch] if batch else batches


@pytest.mark.parametrize("seed", range(40))
def test_token_batches_cut_as_the_greedy_rule_does(seed: int) -> None:
    """The binary-search cut equals the greedy rule applied one example at a time, including
    examples wider than the budget and runs of equal widths."""
    from aiayn.data.sampler import token_batches

    rng = np.random.default_rng(seed)
    widths = rng.integers(1, 80, size=int(rng.integers(1, 400)))
    order = rng.permutation(len(widths))
    order = order[np.argsort(widths[order], kind="stable")]
    max_tokens = int(rng.choice([16, 64, 100, 257, 1000]))
    got = [batch.tolist() for batch in token_batches(widths, order, max_tokens)]
    assert got == _greedy(widths, order, max_tokens)
    with pytest.raises(ValueError, match="ascending"):
        token_batches(np.array([3, 1]), np.array([0, 1]), 10)
