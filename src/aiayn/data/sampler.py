"""Token-budget batches from length-sorted examples, sharded over DDP ranks, resumable.

Batching: an example's width is max(len(x) + 1, len(y) + 1) (x + EOS, BOS + y). Examples are
sorted by (width, len(x) - len(y)), so a batch holds pairs of equal width and similar shape
(ties in a random order fixed per cache, `TIES_SEED`, for training; in index order for
evaluation), and cut greedily
so that batch_size * max(width) <= max_tokens. On Multi30k at 4096 tokens the padding
efficiency (real tokens / padded slots, both sides) is about 0.96.

The batches are a `BatchPlan`, built once per split and max_tokens and memory-mapped from the
data cache (as fairseq fixes its batches once): a rank holds O(batches) in memory, never
O(examples), so its memory does not grow with the corpus. Training shuffles the order of the
batches every epoch (seeded by (seed, epoch)); evaluation keeps them in sorted order. With
`regroup` (`data.regroup`) training also deals the examples of each width out to that
width's batches afresh every epoch (Sockeye reshuffles within its buckets, fairseq does
not): each run of equal-width examples in the plan is permuted by an affine map
i -> (a i + c) mod n drawn per (seed, epoch), so batch sizes and widths stay the plan's while
who shares a batch changes, still in O(batches) memory. Within a width the examples are then
no longer ordered by shape, so the shorter side pads a little more than the plan's padding
efficiency says.
Everything is a pure function of (plan, seed, epoch, rank, world_size).

Sharding: while the number of batches is not a multiple of world_size, the batch with the most
examples is split in two (the same split every epoch); rank r then takes batches r,
r + world_size, ... of the epoch's order. Every rank gets the same number of batches and no
example is dropped or repeated (only with fewer examples than ranks are batches repeated).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from aiayn.errors import DataError

log = logging.getLogger(__name__)
TIES_SEED = 0  # the order of equal-shape training examples inside the plan (fixed per cache)
PLAN_VERSION = 1  # of how a plan is built and stored: a saved plan of another version is rebuilt


def token_bounds(widths: np.ndarray, max_tokens: int) -> np.ndarray:
    """(B + 1,) int64 batch boundaries cutting `widths` (non-decreasing) greedily into batches
    of padded size <= max_tokens (a single example wider than max_tokens still gets a batch of
    its own). The widest example of a batch is its last, so each batch's end is a binary
    search: a WMT-size split (4.5M pairs) is cut in a fraction of a second."""
    if (np.diff(widths) < 0).any():
        raise ValueError("token_bounds needs the widths in ascending order")
    ordered = widths.tolist()  # Python ints: the search below reads them one at a time
    ends, start, n = [0], 0, len(ordered)
    while start < n:
        room = min(n, start + max_tokens // max(ordered[start], 1) + 1)  # no batch holds more
        count = bisect.bisect_right(
            range(start + 1, room + 1), max_tokens, key=lambda e: (e - start) * ordered[e - 1]
        )
        start += max(count, 1)
        ends.append(start)
    return np.array(ends, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """A split's batches: batch b is `order[bounds[b]:bounds[b + 1]]`.

    order (N,) int32|int64: example indices sorted by (width, shape); bounds (B + 1,) int64.
    Loaded from the cache both are memory maps: only the pages of the batches read are ever
    resident. runs (R + 1,) int64: where each width's examples start in `order` (R widths).
    """

    order: np.ndarray
    bounds: np.ndarray
    padding_efficiency: float
    max_tokens: int
    shuffle: bool
    runs: np.ndarray

    @classmethod
    def build(
        cls, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, shuffle: bool
    ) -> BatchPlan:
        """Sort and cut (src_lengths, tgt_lengths: (N,) token counts without specials);
        equal-shape examples in a seeded random order when `shuffle`, else by index."""
        src, tgt = np.asarray(src_lengths), np.asarray(tgt_lengths)
        widths = np.maximum(src, tgt) + 1
        n = len(widths)
        index = np.int32 if n < 2**31 else np.int64  # the plan holds N of them
        rng = np.random.default_rng(TIES_SEED)
        order = (rng.permutation(n) if shuffle else np.arange(n)).astype(index)
        order = order[np.lexsort((src[order] - tgt[order], widths[order]))]
        bounds = token_bounds(widths[order], max_tokens)
        efficiency = _padding_efficiency(src[order], tgt[order], bounds)
        runs = np.concatenate([[0], np.flatnonzero(np.diff(widths[order])) + 1, [n]])
        return cls(order, bounds, efficiency, int(max_tokens), bool(shuffle), runs.astype(np.int64))

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def identity(self) -> list[int]:
        """[version, examples, max_tokens, shuffle, batches]: what a data position in a
        checkpoint refers to (`TokenBatchSampler.state_dict`)."""
        return [PLAN_VERSION, len(self.order), self.max_tokens, int(self.shuffle), len(self)]

    def save(self, directory: Path, name: str) -> None:
        """Write `{name}.order.npy`, `{name}.bounds.npy` and `{name}.json` (last: a plan is
        whole once its json exists). Every writer writes the same bytes, and each file
        appears by rename, so processes racing to save one plan do no harm; a failed write
        leaves nothing behind."""
        meta = {"version": PLAN_VERSION, "examples": len(self.order)}
        meta |= {"max_tokens": self.max_tokens, "shuffle": self.shuffle}
        meta["padding_efficiency"] = self.padding_efficiency
        meta["runs"] = [int(start) for start in self.runs]
        parts = [("order.npy", self.order), ("bounds.npy", self.bounds), ("json", meta)]
        for suffix, content in parts:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".{suffix}", dir=directory)
            try:
                with os.fdopen(fd, "wb") as file:
                    if suffix == "json":
                        file.write(json.dumps(content).encode())
                    else:
                        np.save(file, content)
                os.chmod(tmp, 0o644)  # mkstemp's 0o600 would hide the plan from other users
                os.replace(tmp, directory / f"{name}.{suffix}")
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    @classmethod
    def load(
        cls, directory: Path, name: str, examples: int, max_tokens: int, shuffle: bool
    ) -> BatchPlan | None:
        """The plan saved under `name` in `directory`, memory-mapped; None if there is none,
        or if it is not whole or not the plan of `examples` pairs at (max_tokens, shuffle) of
        this PLAN_VERSION (it is then rebuilt; so is one saved before plans held `runs`)."""
        want = {"version": PLAN_VERSION, "examples": examples}
        want |= {"max_tokens": max_tokens, "shuffle": shuffle}
        try:
            meta = json.loads((directory / f"{name}.json").read_text())
            order, bounds = (
                np.load(directory / f"{name}.{part}.npy", mmap_mode="r")
                for part in ("order", "bounds")
            )
            if {key: meta.get(key) for key in want} != want:
                return None
            efficiency = float(meta["padding_efficiency"])
            runs = np.asarray(meta["runs"], dtype=np.int64)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        whole = (
            order.ndim == bounds.ndim == 1
            and len(order) == examples
            and len(bounds) >= 1
            and bounds[0] == 0
            and bounds[-1] == examples
            and bool((np.diff(bounds) > 0).all())
            and runs.ndim == 1
            and len(runs) >= 1
            and runs[0] == 0
            and runs[-1] == examples
            and bool((np.diff(runs) > 0).all())
        )
        return cls(order, bounds, efficiency, max_tokens, shuffle, runs) if whole else None


def _padding_efficiency(src: np.ndarray, tgt: np.ndarray, bounds: np.ndarray) -> float:
    """Real tokens / padded slots over both sides of all batches (src, tgt: lengths without
    specials in plan order)."""
    if len(bounds) < 2:
        return 0.0
    starts, sizes = bounds[:-1], np.diff(bounds)
    s, t = src.astype(np.int64) + 1, tgt.astype(np.int64) + 1
    widest = np.maximum.reduceat(s, starts) + np.maximum.reduceat(t, starts)
    return int(s.sum() + t.sum()) / max(int((sizes * widest).sum()), 1)


def split_to_multiple(ranges: np.ndarray, world_size: int) -> np.ndarray:
    """(B', 2) [start, end) ranges: the largest of `ranges` (B, 2) split in two until B' is a
    multiple of world_size (with fewer examples than ranks, ranges repeat instead)."""
    ranges = ranges.copy()
    while len(ranges) % world_size:
        sizes = ranges[:, 1] - ranges[:, 0]
        i = int(np.argmax(sizes))
        if sizes[i] < 2:
            total = -(-len(ranges) // world_size) * world_size
            return ranges[np.arange(total) % len(ranges)]
        start, end = ranges[i]
        half = start + (end - start) // 2
        ranges = np.concatenate([ranges[:i], [[start, half], [half, end]], ranges[i + 1 :]])
    return ranges


class TokenBatchSampler(Sampler[list[int]]):
    """Yields lists of example indices for one rank (see the module docstring).

    Holds the plan's memory maps and the epoch's (B, 2) batch ranges. `state_dict()` holds
    the epoch and how many batches this rank has yielded in it; after `load_state_dict` the
    next iteration yields exactly the rest of that epoch.
    """

    def __init__(
        self,
        plan: BatchPlan,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        regroup: bool = False,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.plan, self.shuffle, self.seed = plan, shuffle, seed
        self.regroup = regroup and shuffle
        self.rank, self.world_size = rank, world_size
        bounds = np.asarray(plan.bounds)
        self.ranges = split_to_multiple(np.stack([bounds[:-1], bounds[1:]], axis=1), world_size)
        self.epoch = 0
        self.position = 0  # batches yielded in the current epoch
        self._resume_at = 0

    def epoch_ranges(self) -> np.ndarray:
        """(B, 2) [start, end) into `plan.order` of all batches of the current epoch, in
        order, before sharding (a multiple of world_size of them)."""
        if not self.shuffle:
            return self.ranges
        rng = np.random.default_rng([self.seed, self.epoch])
        return self.ranges[rng.permutation(len(self.ranges))]

    def epoch_maps(self) -> np.ndarray | None:
        """(R, 2) int64 (a, c) per width run of the plan, None without `regroup`: this
        epoch's position i of a run of n examples takes the run's example (a i + c) mod n
        (a coprime to n: a permutation)."""
        if not self.regroup:
            return None
        rng = np.random.default_rng([self.seed, self.epoch, 1])
        maps = []
        for n in np.diff(np.asarray(self.plan.runs)).tolist():
            a = int(rng.integers(1, n)) if n > 2 else 1
            while math.gcd(a, n) != 1:
                a = int(rng.integers(1, n))
            maps.append((a, int(rng.integers(0, n))))
        return np.array(maps, dtype=np.int64).reshape(-1, 2)

    def examples(self, begin: int, end: int, maps: np.ndarray | None) -> list[int]:
        """The example indices of the batch at [begin, end) of `plan.order`, regrouped by
        `maps` (`epoch_maps`) where given."""
        if maps is None:
            return self.plan.order[begin:end].tolist()
        runs = np.asarray(self.plan.runs)
        at = np.arange(begin, end, dtype=np.int64)
        run = np.searchsorted(runs, at, side="right") - 1
        start, size = runs[run], runs[run + 1] - runs[run]
        moved = start + (maps[run, 0] * (at - start) + maps[run, 1]) % size
        return self.plan.order[moved].tolist()

    @property
    def sampler(self) -> TokenBatchSampler:
        """Itself: Lightning calls `loader.batch_sampler.sampler.set_epoch(epoch)` each epoch."""
        return self

    def __len__(self) -> int:
        """Batches per rank per epoch (the same on every rank and in every epoch)."""
        return len(self.ranges) // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        start, self._resume_at = self._resume_at, 0
        self.position = start
        maps = self.epoch_maps()
        for begin, end in self.epoch_ranges()[self.rank :: self.world_size][start:].tolist():
            self.position += 1
            yield self.examples(begin, end, maps)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order; a resumed position is kept only for the same epoch."""
        if epoch != self.epoch:
            self.epoch, self._resume_at = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        """The epoch, batches this rank has yielded in it, the sharding they came from (a
        position means nothing under another world size), the plan they were cut by and
        whether its examples were regrouped."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "world_size": self.world_size,
            "batches": len(self),
            "plan": self.plan.identity,
            "regroup": self.regroup,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` stopped: an epoch end is the end of that epoch under any
        world size (its examples are not seen again); refused mid-epoch under another world
        size; where
        the batches were cut otherwise (another data.max_tokens or corpus, or a checkpoint
        from before batch plans), the epoch goes on from the same fraction of it, with a
        warning that its examples are no longer each seen exactly once; the same warning where
        `regroup` changed mid-epoch (the rest of the epoch deals its examples out otherwise)."""
        if mid_epoch_world_size(state) not in (None, self.world_size):
            raise DataError(
                f"the run stopped in the middle of epoch {state['epoch']} with "
                f"{state['world_size']} processes; its data position cannot continue with "
                f"{self.world_size}: resume with {state['world_size']} processes "
                "(trainer.devices x trainer.num_nodes)"
            )
        self.epoch = int(state["epoch"])
        position = int(state["position"])
        batches = int(state.get("batches", len(self)))
        if batches and position >= batches:  # an epoch end: none of it is left, at any size
            position = len(self)
        elif 0 < position < batches and state.get("plan") != self.plan.identity:
            position = round(position * len(self) / batches)
            log.warning(
                "the checkpoint stopped after batch %d of %d of epoch %d, cut by another batch "
                "plan (%s; now %s: data.max_tokens or the data changed, or the checkpoint "
                "predates batch plans): the epoch goes on from batch %d of %d, so some of its "
                "examples are skipped or seen twice",
                state["position"],
                batches,
                self.epoch,
                state.get("plan", "unknown"),
                self.plan.identity,
                position,
                len(self),
            )
        if 0 < position < len(self) and state.get("regroup", self.regroup) != self.regroup:
            log.warning(
                "the checkpoint stopped after batch %d of %d of epoch %d with data.regroup=%s; "
                "now data.regroup=%s deals the rest of that epoch's examples out otherwise, "
                "so some of them are skipped or seen twice (the epochs after it are exact)",
                state["position"],
                batches,
                self.epoch,
                str(state["regroup"]).lower(),
                str(self.regroup).lower(),
            )
        self.position = self._resume_at = position


def mid_epoch_world_size(state: dict[str, Any]) -> int | None:
    """The world size a sampler state was written under when it stopped mid-epoch (only
    then does it matter), else None (an epoch end, or a state from before it was saved)."""
    if "world_size" not in state or not 0 < state["position"] < state["batches"]:
        return None
    return int(state["world_size"])
