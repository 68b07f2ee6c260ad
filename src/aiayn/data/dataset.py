"""Memory-mapped splits of the prepared cache and collation into a typed `Batch`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from aiayn.data.sampler import BatchPlan
from aiayn.data.special import BOS, EOS, PAD
from aiayn.errors import DataError

log = logging.getLogger(__name__)

Item = tuple[int, np.ndarray, np.ndarray]  # (example id, source ids, target ids), no specials


@dataclass
class Batch:
    """A padded batch (PAD = 0; all tensors int64; Lightning moves it to the device).

    src (B, S): x + EOS          src_lengths (B,): real length of each src row
    tgt_in (B, T): BOS + y       tgt_out (B, T): y + EOS   tgt_lengths (B,): real length of both
    ids (B,): example index within the split (`datamodule.references(split)[id]`)
    num_src_tokens / num_tgt_tokens: real (non-PAD) tokens of src / tgt_out.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    src_lengths: torch.Tensor
    tgt_lengths: torch.Tensor
    ids: torch.Tensor
    num_src_tokens: int
    num_tgt_tokens: int

    def pin_memory(self) -> Batch:
        """The batch in page-locked memory (the DataLoader's `pin_memory=True` calls this), so
        that its copy to a GPU runs without waiting (Lightning copies with non_blocking)."""
        pinned = {name: getattr(self, name).pin_memory() for name in TENSOR_FIELDS}
        return replace(self, **pinned)


TENSOR_FIELDS = ("src", "tgt_in", "tgt_out", "src_lengths", "tgt_lengths", "ids")


def pad_rows(rows: Sequence[Sequence[int]], prefix: int | None, suffix: int | None) -> tuple:
    """(padded (B, L) int64, lengths (B,) int64) of [prefix] + row + [suffix], PAD-padded."""
    extra = (prefix is not None) + (suffix is not None)
    lengths = np.fromiter((len(row) + extra for row in rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max(initial=1))), PAD, dtype=np.int64)
    start = int(prefix is not None)
    for i, row in enumerate(rows):
        out[i, start : start + len(row)] = row
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(rows)), lengths - 1] = suffix
    return torch.from_numpy(out), torch.from_numpy(lengths)


def collate_sources(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(src (B, S), src_lengths (B,)) from token ids without specials, exactly as in training
    (x + EOS): use it to feed `Tokenizers.encode(texts, 'src')` to the model at inference."""
    return pad_rows(rows, None, EOS)


def collate(items: Sequence[Item]) -> Batch:
    """Batch from (id, source ids, target ids) items."""
    src, src_lengths = collate_sources([item[1] for item in items])
    targets = [item[2] for item in items]
    tgt_in, tgt_lengths = pad_rows(targets, BOS, None)
    tgt_out, _ = pad_rows(targets, None, EOS)
    return Batch(
        src=src,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        src_lengths=src_lengths,
        tgt_lengths=tgt_lengths,
        ids=torch.tensor([item[0] for item in items], dtype=torch.int64),
        num_src_tokens=int(src_lengths.sum()),
        num_tgt_tokens=int(tgt_lengths.sum()),
    )


def plan_name(role: str, max_tokens: int) -> str:
    """The cache's file stem for a split's batch plan (`BatchPlan.save`)."""
    return f"{role}.plan-{max_tokens}"


class SplitDataset(Dataset):
    """One split of the cache: item i = (i, source ids, target ids) read from memory maps.

    The maps are opened lazily in each process (pickling for workers sends only the paths).
    Nothing per example is held in memory: lengths come from the offsets when asked for.
    """

    def __init__(self, directory: Path, role: str) -> None:
        self.directory, self.role = Path(directory), role
        self._arrays: dict[str, np.ndarray] | None = None
        self._plans: dict[int, BatchPlan] = {}  # by max_tokens
        self._len = len(self._load("src.offsets")) - 1

    def _load(self, name: str) -> np.ndarray:
        path = self.directory / f"{self.role}.{name}.npy"
        try:
            return np.load(path, mmap_mode="r")
        except (OSError, ValueError, EOFError) as error:  # missing, truncated, not an array
            raise self._damaged(path, error) from None

    def _damaged(self, path: Path, what: object) -> DataError:
        return DataError(
            f"data cache file {path} is damaged ({what}): delete {self.directory} and run again "
            "to prepare it anew"
        )

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            names = ("src.tokens", "src.offsets", "tgt.tokens", "tgt.offsets")
            arrays = {name: self._load(name) for name in names}
            for side in ("src", "tgt"):  # the offsets end where the tokens do
                tokens, offsets = arrays[f"{side}.tokens"], arrays[f"{side}.offsets"]
                if len(offsets) != self._len + 1 or int(offsets[-1]) != len(tokens):
                    path = self.directory / f"{self.role}.{side}.tokens.npy"
                    raise self._damaged(path, f"{len(tokens)} tokens, offsets end at {offsets[-1]}")
            self._arrays = arrays
        return self._arrays

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None, "_plans": {}}

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Item:
        a = self.arrays
        src = a["src.tokens"][a["src.offsets"][i] : a["src.offsets"][i + 1]]
        tgt = a["tgt.tokens"][a["tgt.offsets"][i] : a["tgt.offsets"][i + 1]]
        return int(i), src, tgt

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """((N,), (N,)) int32 source and target lengths without specials (computed, O(N))."""
        src, tgt = (np.diff(self._load(f"{side}.offsets")) for side in ("src", "tgt"))
        return src.astype(np.int32), tgt.astype(np.int32)

    def batch_plan(self, max_tokens: int) -> BatchPlan:
        """This split's batches of <= max_tokens (equal-shape examples in a seeded random
        order for train, by index for val/test), memory-mapped from the cache; built and saved
        there on first use (prepare builds data.max_tokens's). Where the cache cannot be
        written, the plan is kept in memory with a warning."""
        if max_tokens not in self._plans:
            self._plans[max_tokens] = self._batch_plan(max_tokens)
        return self._plans[max_tokens]

    def saved_plan(self, max_tokens: int) -> BatchPlan | None:
        """The plan for max_tokens saved in the cache, memory-mapped; None if there is none,
        or it is damaged or of another PLAN_VERSION or corpus."""
        name, shuffle = plan_name(self.role, max_tokens), self.role == "train"
        return BatchPlan.load(self.directory, name, len(self), max_tokens, shuffle)

    def _batch_plan(self, max_tokens: int) -> BatchPlan:
        name, shuffle = plan_name(self.role, max_tokens), self.role == "train"
        plan = self.saved_plan(max_tokens)
        if plan is None:
            plan = BatchPlan.build(*self.lengths(), max_tokens, shuffle)
            try:
                plan.save(self.directory, name)
            except OSError as error:
                log.warning(
                    "could not save the batch plan %s in %s (%s): it stays in this "
                    "process's memory, which then grows with the corpus",
                    name,
                    self.directory,
                    error,
                )
            else:
                loaded = self.saved_plan(max_tokens)
                plan = plan if loaded is None else loaded
        return plan
