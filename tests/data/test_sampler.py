"""BatchPlan and TokenBatchSampler: token budget, equal DDP shards, determinism, exact resume,
memory-mapped plans."""

import json
import logging
from itertools import islice, pairwise

import numpy as np
import pytest

from aiayn.data import sampler as module
from aiayn.data.sampler import BatchPlan, TokenBatchSampler
from aiayn.errors import DataError

RNG = np.random.default_rng(0)
SRC = RNG.integers(1, 60, size=2000)
TGT = np.clip(SRC + RNG.integers(-5, 6, size=2000), 1, None)
WIDTH = np.maximum(SRC, TGT) + 1


def make(max_tokens: int = 512, shuffle: bool = True, seed: int = 3, **kwargs: int):
    plan = BatchPlan.build(SRC, TGT, max_tokens, shuffle)
    return TokenBatchSampler(plan, shuffle, seed, **kwargs)


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
        list(TokenBatchSampler(BatchPlan.build([3, 4], [5, 2], 64, False), False, 0, r, 3))
        for r in range(3)
    ]
    assert [len(shard) for shard in shards] == [1, 1, 1]
    assert {i for shard in shards for b in shard for i in b} == {0, 1}


def test_deterministic_per_epoch_and_shuffled_between_epochs() -> None:
    """Each epoch has the same batches (the plan) in its own order, a function of the seed."""
    a, b = make(), make()
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert second != first
    assert sorted(second) == sorted(first)
    assert list(make(seed=4)) != first
    assert list(make(shuffle=False)) == list(make(shuffle=False, seed=9))


def test_plan_sorts_by_width_then_shape_with_ties_shuffled_only_for_training() -> None:
    for shuffle in (True, False):
        plan = BatchPlan.build(SRC, TGT, 512, shuffle)
        order = np.asarray(plan.order)
        key = np.stack([WIDTH[order], SRC[order] - TGT[order]], axis=1)
        assert (np.diff(key[:, 0]) >= 0).all()
        same_width = np.diff(key[:, 0]) == 0
        assert (np.diff(key[:, 1])[same_width] >= 0).all()
        ties = same_width & (np.diff(key[:, 1]) == 0)
        ascending = (np.diff(order)[ties] > 0).mean()
        assert ascending == 1.0 if not shuffle else 0.3 < ascending < 0.7
    assert plan.bounds[0] == 0 and plan.bounds[-1] == len(SRC)


def test_padding_efficiency_counts_real_over_padded_slots() -> None:
    plan = BatchPlan.build([1, 3, 2], [2, 1, 4], max_tokens=10, shuffle=False)
    batches = [np.asarray(plan.order[a:b]) for a, b in pairwise(plan.bounds)]
    assert [b.tolist() for b in batches] == [[0, 1], [2]]  # widths 3, 4 | 5 (3 x 5 > 10)
    real = (1 + 1) + (3 + 1) + (2 + 1) + (2 + 1) + (1 + 1) + (4 + 1)
    padded = 2 * (4 + 3) + 1 * (3 + 5)  # (widest src + widest tgt) x rows
    assert plan.padding_efficiency == pytest.approx(real / padded)


def test_a_saved_plan_loads_memory_mapped_and_equal(tmp_path) -> None:
    plan = BatchPlan.build(SRC, TGT, 512, True)
    plan.save(tmp_path, "train.plan-512")
    loaded = BatchPlan.load(tmp_path, "train.plan-512", len(SRC), 512, True)
    assert isinstance(loaded.order, np.memmap) and isinstance(loaded.bounds, np.memmap)
    assert (loaded.order == plan.order).all() and (loaded.bounds == plan.bounds).all()
    assert loaded.padding_efficiency == plan.padding_efficiency
    assert loaded.identity == plan.identity == [module.PLAN_VERSION, len(SRC), 512, 1, len(plan)]
    assert BatchPlan.load(tmp_path, "train.plan-1024", len(SRC), 1024, True) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"train.plan-512.{part}" for part in ("bounds.npy", "json", "order.npy")
    ]
    sampler = TokenBatchSampler(loaded, True, 3)
    assert list(sampler) == list(make())
    assert sampler.ranges.nbytes == 16 * len(sampler)  # O(batches) in memory, not O(pairs)


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_yields_exactly_the_rest(world_size: int) -> None:
    run = make(rank=world_size - 1, world_size=world_size)
    run.set_epoch(2)
    uninterrupted = list(run)
    interrupted = make(rank=world_size - 1, world_size=world_size)
    interrupted.set_epoch(2)
    assert list(islice(iter(interrupted), 5)) == uninterrupted[:5]
    state = interrupted.state_dict()
    assert state == {
        "epoch": 2,
        "position": 5,
        "world_size": world_size,
        "batches": len(run),
        "plan": run.plan.identity,
        "regroup": False,
    }
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


@pytest.mark.parametrize("resumed_on", [1, 2, 3])
def test_an_epoch_end_resumed_on_fewer_processes_sees_each_example_once(resumed_on) -> None:
    """4 processes stop at the end of epoch 1; resumed on 3, 2 or 1, the rest of epoch 1 is
    empty and epoch 2 covers every example once (issue 49: on f5393e6 two processes read the
    4-process position 'batch n of n' as half their epoch and saw 0.49 of it again)."""
    stopped = [make(rank=r, world_size=4) for r in range(4)]
    for sampler in stopped:
        sampler.set_epoch(1)
        list(sampler)
    state = stopped[0].state_dict()
    assert state["position"] == state["batches"]
    seen = []
    for rank in range(resumed_on):
        resumed = make(rank=rank, world_size=resumed_on)
        resumed.load_state_dict(state)
        resumed.set_epoch(1)  # Lightning re-enters the stopped epoch first
        assert list(resumed) == []
        resumed.set_epoch(2)
        seen += [i for batch in resumed for i in batch]
    assert sorted(seen) == list(range(len(SRC)))


def test_a_saved_plan_that_does_not_match_is_not_used(tmp_path, monkeypatch) -> None:
    """A plan of another corpus size, budget, shuffle or PLAN_VERSION, or a damaged one, loads
    as None (and is rebuilt), never as batches that skip or repeat examples."""
    plan = BatchPlan.build(SRC, TGT, 512, True)
    plan.save(tmp_path, "p")
    assert BatchPlan.load(tmp_path, "p", len(SRC), 512, True) is not None
    assert BatchPlan.load(tmp_path, "p", len(SRC) + 1, 512, True) is None  # the corpus grew
    assert BatchPlan.load(tmp_path, "p", len(SRC), 256, True) is None
    assert BatchPlan.load(tmp_path, "p", len(SRC), 512, False) is None
    monkeypatch.setattr(module, "PLAN_VERSION", module.PLAN_VERSION + 1)
    assert BatchPlan.load(tmp_path, "p", len(SRC), 512, True) is None
    monkeypatch.undo()
    np.save(tmp_path / "p.bounds.npy", np.asarray(plan.bounds)[:-1])  # cut short
    assert BatchPlan.load(tmp_path, "p", len(SRC), 512, True) is None
    (tmp_path / "p.json").write_text("{")
    assert BatchPlan.load(tmp_path, "p", len(SRC), 512, True) is None
    (tmp_path / "p.json").write_text(json.dumps({"version": module.PLAN_VERSION}))
    assert BatchPlan.load(tmp_path, "p", len(SRC), 512, True) is None


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch) -> None:
    plan = BatchPlan.build(SRC, TGT, 512, True)

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", disk_full)
    with pytest.raises(OSError, match="No space"):
        plan.save(tmp_path, "p")
    assert list(tmp_path.iterdir()) == []


def test_a_position_from_another_plan_goes_on_from_the_same_fraction_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A checkpoint whose batches were cut otherwise (data.max_tokens changed, or written
    before batch plans) still resumes: the epoch goes on from the same fraction of it, and the
    user is told that it is not exact. The same plan resumes exactly and silently."""
    stopped = make(max_tokens=512)
    stopped.set_epoch(1)
    list(islice(iter(stopped), 10))
    state = stopped.state_dict()
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        same = make(max_tokens=512)
        same.load_state_dict(state)
        assert not caplog.records
        other = make(max_tokens=1024)
        other.load_state_dict(state)
        assert "cut by another batch plan" in caplog.text
        assert "some of its examples are skipped or seen twice" in caplog.text
        caplog.clear()
        old = make(max_tokens=512)
        old.load_state_dict({k: v for k, v in state.items() if k != "plan"})  # before plans
        assert "cut by another batch plan (unknown" in caplog.text
    expected = round(10 * len(other) / len(stopped))
    assert expected != 10 and other.position == expected
    other.set_epoch(1)
    rest = list(other)
    assert len(rest) == len(other) - expected
    whole = make(max_tokens=1024)
    whole.set_epoch(1)
    assert rest == list(whole)[expected:]


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
    from aiayn.data.sampler import token_bounds

    rng = np.random.default_rng(seed)
    widths = rng.integers(1, 80, size=int(rng.integers(1, 400)))
    order = rng.permutation(len(widths))
    order = order[np.argsort(widths[order], kind="stable")]
    max_tokens = int(rng.choice([16, 64, 100, 257, 1000]))
    bounds = token_bounds(widths[order], max_tokens)
    got = [order[a:b].tolist() for a, b in pairwise(bounds)]
    assert got == _greedy(widths, order, max_tokens)
    with pytest.raises(ValueError, match="ascending"):
        token_bounds(np.array([3, 1]), 10)


def test_regroup_deals_each_width_out_afresh_every_epoch() -> None:
    """With `regroup`, each batch of an epoch holds examples of the widths the plan's batch at
    its place holds (so the budget holds), every example once, its members changing from
    epoch to epoch; the same (seed, epoch) gives the same batches on every rank and after a
    resume; evaluation (shuffle off) ignores it."""
    epochs = []
    for epoch in (0, 1):
        batches = []
        for rank in (0, 1):
            plain, regrouped = (
                make(rank=rank, world_size=2),
                make(regroup=True, rank=rank, world_size=2),
            )
            plain.set_epoch(epoch), regrouped.set_epoch(epoch)
            pairs = list(zip(plain, regrouped, strict=True))
            assert all(sorted(WIDTH[a]) == sorted(WIDTH[b]) for a, b in pairs)
            batches += [b for _, b in pairs]
        assert sorted(i for b in batches for i in b) == list(range(2000))
        epochs.append({frozenset(b) for b in batches if len(b) > 1})
    fixed = {frozenset(b) for r in (0, 1) for b in make(rank=r, world_size=2)}
    assert len(epochs[0] & epochs[1]) < 0.1 * len(epochs[0])
    assert len(epochs[0] & fixed) < 0.1 * len(epochs[0])
    again = make(regroup=True)
    again.set_epoch(1)
    first = list(again)
    resumed = make(regroup=True)
    resumed.load_state_dict({**again.state_dict(), "position": 3})
    assert list(resumed) == first[3:]
    assert list(make(shuffle=False, regroup=True)) == list(make(shuffle=False))


def test_a_mid_epoch_resume_that_changes_regroup_warns(caplog: pytest.LogCaptureFixture) -> None:
    """`data.regroup` deals an epoch's examples out by (seed, epoch): a run stopped mid-epoch
    and resumed with the other setting goes on from the same batch, but the rest of that epoch
    is dealt out otherwise, so its examples are no longer each seen once, and the user is told.
    The same setting, an epoch end and a checkpoint that did not record it resume silently."""
    stopped = make(regroup=True)
    stopped.set_epoch(1)
    seen = list(islice(iter(stopped), 10))
    state = stopped.state_dict()
    assert state["regroup"] is True
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        make(regroup=True).load_state_dict(state)
        make().load_state_dict({k: v for k, v in state.items() if k != "regroup"})
        make().load_state_dict({**state, "position": state["batches"]})
        assert not caplog.records
        plain = make()
        plain.load_state_dict(state)
        assert "epoch 1 with data.regroup=true; now data.regroup=false" in caplog.text
        assert "some of them are skipped or seen twice" in caplog.text
    plain.set_epoch(1)
    rest = list(plain)
    whole = make()
    whole.set_epoch(1)
    assert rest == list(whole)[10:]
    assert sorted(i for b in seen + rest for i in b) != list(range(len(SRC)))


def test_a_plan_saved_without_its_runs_is_rebuilt(tmp_path) -> None:
    plan = BatchPlan.build(SRC, TGT, 512, True)
    plan.save(tmp_path, "train.plan-512")
    meta = tmp_path / "train.plan-512.json"
    saved = json.loads(meta.read_text())
    loaded = BatchPlan.load(tmp_path, "train.plan-512", len(SRC), 512, True)
    assert (np.asarray(loaded.runs) == plan.runs).all()
    widths = WIDTH[np.asarray(plan.order)]
    assert all((widths[a:b] == widths[a]).all() for a, b in pairwise(plan.runs))
    assert len(plan.runs) - 1 == len(np.unique(WIDTH))
    del saved["runs"]
    meta.write_text(json.dumps(saved))
    assert BatchPlan.load(tmp_path, "train.plan-512", len(SRC), 512, True) is None
