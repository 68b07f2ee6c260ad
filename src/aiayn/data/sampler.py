"""Token-budget batches from length-sorted examples, sharded over DDP ranks, resumable.

Batching: an example's width is max(len(x) + 1, len(y) + 1) (x + EOS, BOS + y). Examples are
sorted by (width, len(x) - len(y)), so a batch holds pairs of equal width and similar shape
(ties in a random order for training), and cut greedily so that batch_size * max(width) <=
max_tokens. On Multi30k at 4096 tokens the padding efficiency (real tokens / padded slots,
both sides) is about 0.96. Training shuffles the order of the batches every epoch; evaluation
keeps them in sorted order. Everything is a pure function of (seed, epoch, rank, world_size),
and the number of batches never changes between epochs.

Sharding: while the number of batches is not a multiple of world_size, the batch with the most
examples is split in two (before shuffling, so it is the same split every epoch); rank r then
takes batches r, r + world_size, ... Every rank gets the same number of batches and no example
is dropped or repeated (only with fewer examples than ranks are batches repeated).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from aiayn.errors import DataError


def token_batches(widths: np.ndarray, order: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Cut `order` (indices into widths, by non-decreasing width) greedily into batches of
    padded size <= max_tokens (a single example wider than max_tokens still gets a batch of
    its own). The widest example of a batch is its last, so each batch's end is a binary
    search: a WMT-size epoch (4.5M pairs) is cut in a fraction of a second."""
    ordered = widths[order]
    if (np.diff(ordered) < 0).any():
        raise ValueError("token_batches needs `order` to sort the widths in ascending order")
    ordered = ordered.tolist()  # Python ints: the search below reads them one at a time
    ends, start, n = [], 0, len(ordered)
    while start < n:
        room = min(n, start + max_tokens // max(ordered[start], 1) + 1)  # no batch holds more
        count = bisect.bisect_right(
            range(start + 1, room + 1), max_tokens, key=lambda e: (e - start) * ordered[e - 1]
        )
        start += max(count, 1)
        ends.append(start)
    return np.split(order, ends[:-1])


def split_to_multiple(batches: list[np.ndarray], world_size: int) -> list[np.ndarray]:
    """Split the largest batches in two until len(batches) is a multiple of world_size."""
    batches = list(batches)
    while len(batches) % world_size:
        i = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[i]) < 2:
            return [
                batches[k % len(batches)]
                for k in range(-(-len(batches) // world_size) * world_size)
            ]
        half = len(batches[i]) // 2
        batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
    return batches


def padding_efficiency(
    batches: list[np.ndarray], src_len: np.ndarray, tgt_len: np.ndarray
) -> float:
    """Real tokens / padded slots over both sides of all batches (lengths without specials)."""
    if not batches:
        return 0.0
    members = np.concatenate(batches)
    sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    starts = np.cumsum(sizes) - sizes
    s, t = src_len[members] + 1, tgt_len[members] + 1
    widest = np.maximum.reduceat(s, starts) + np.maximum.reduceat(t, starts)
    return int(s.sum() + t.sum()) / max(int((sizes * widest).sum()), 1)


class TokenBatchSampler(Sampler[list[int]]):
    """Yields lists of example indices for one rank (see the module docstring).

    src_lengths, tgt_lengths: (N,) token counts without specials. `state_dict()` holds the
    epoch and how many batches this rank has yielded in it; after `load_state_dict` the next
    iteration yields exactly the rest of that epoch.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
        self.widths = np.maximum(self.src_lengths, self.tgt_lengths) + 1
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.position = 0  # batches yielded in the current epoch
        self._resume_at = 0
        self._cached: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches)
        self._num_batches = len(self.epoch_batches())

    def epoch_batches(self) -> list[np.ndarray]:
        """All batches of the current epoch, in order, before sharding (a multiple of
        world_size of them); computed once per epoch (seconds on a WMT-size corpus)."""
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = (self.epoch, self._compute_epoch_batches())
        return self._cached[1]

    def _compute_epoch_batches(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, self.epoch])
        n = len(self.widths)
        index = np.int32 if n < 2**31 else np.int64  # the batches hold N of them
        order = (rng.permutation(n) if self.shuffle else np.arange(n)).astype(index)
        shape = self.src_lengths[order] - self.tgt_lengths[order]
        order = order[np.lexsort((shape, self.widths[order]))]
        batches = split_to_multiple(
            token_batches(self.widths, order, self.max_tokens), self.world_size
        )
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _rank_batches(self) -> list[np.ndarray]:
        return self.epoch_batches()[self.rank :: self.world_size]

    @property
    def sampler(self) -> TokenBatchSampler:
        """Itself: Lightning calls `loader.batch_sampler.sampler.set_epoch(epoch)` each epoch."""
        return self

    def __len__(self) -> int:
        """Batches per rank per epoch (the same on every rank and in every epoch)."""
        return self._num_batches // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        start, self._resume_at = self._resume_at, 0
        self.position = start
        for batch in self._rank_batches()[start:]:
            self.position += 1
            yield batch.tolist()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order; a resumed position is kept only for the same epoch."""
        if epoch != self.epoch:
            self.epoch, self._resume_at = epoch, 0

    def state_dict(self) -> dict[str, int]:
        """The epoch, batches this rank has yielded in it, and the sharding they came from
        (a position means nothing under another world size)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "world_size": self.world_size,
            "batches": len(self),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where `state` stopped; refused mid-epoch under another world size."""
        if mid_epoch_world_size(state) not in (None, self.world_size):
            raise DataError(
                f"the run stopped in the middle of epoch {state['epoch']} with "
                f"{state['world_size']} processes; its data position cannot continue with "
                f"{self.world_size}: resume with {state['world_size']} processes "
                "(trainer.devices x trainer.num_nodes)"
            )
        self.epoch = int(state["epoch"])
        self.position = self._resume_at = int(state["position"])


def mid_epoch_world_size(state: dict[str, int]) -> int | None:
    """The world size a sampler state was written under when it stopped mid-epoch (only
    then does it matter), else None (an epoch end, or a state from before it was saved)."""
    if "world_size" not in state or not 0 < state["position"] < state["batches"]:
        return None
    return int(state["world_size"])
