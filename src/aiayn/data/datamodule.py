"""`TranslationDataModule`: parallel text -> prepared cache -> token-budget batches of `Batch`.

prepare_data (rank 0; idempotent, a stat-only no-op on a cache hit) builds the cache;
setup (every rank) memory-maps it. Loaders shard by (trainer.global_rank, world_size), so
the Trainer needs `use_distributed_sampler=False`. The train sampler's position travels in
Lightning checkpoints through `state_dict` / `load_state_dict`.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from aiayn.data.config import ROLES, DataConfig
from aiayn.data.dataset import SplitDataset, collate
from aiayn.data.prepare import cache_path, load_manifest, prepare
from aiayn.data.sampler import TokenBatchSampler
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import DataError


class TranslationDataModule(L.LightningDataModule):
    """Batches of token ids for the 'train', 'val' and 'test' splits of `cfg`'s corpus."""

    def __init__(self, cfg: DataConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.padding_efficiency: float | None = None  # of the train batches, set by setup
        self._cache_path: Path | None = None
        self._manifest: dict | None = None
        self._tokenizers: Tokenizers | None = None
        self._datasets: dict[str, SplitDataset] = {}
        self._texts: dict[str, list[dict[str, str]]] = {}
        self._train_sampler: TokenBatchSampler | None = None
        self._sampler_state: dict[str, int] | None = None

    @property
    def cache_path(self) -> Path:
        """The cache directory for this config (exists after prepare_data)."""
        if self._cache_path is None:
            self._cache_path = cache_path(self.cfg)
        return self._cache_path

    @property
    def manifest(self) -> dict:
        if self._manifest is None:
            self._manifest = load_manifest(self.cache_path)
            if self._manifest is None:
                raise DataError(f"no complete data cache at {self.cache_path}: call prepare_data()")
        return self._manifest

    def prepare_data(self) -> None:
        """Build the cache unless it exists (rank 0; safe to call again on any rank)."""
        self._cache_path = prepare(self.cfg)

    def setup(self, stage: str | None = None) -> None:
        """Open every split (its memory maps open on first read); for fit, load the train
        split's batch plan and report its padding efficiency."""
        for role in ROLES:
            if role not in self._datasets:
                self._datasets[role] = SplitDataset(self.cache_path, role)
        if self.padding_efficiency is None and stage in (None, "fit"):
            train = self._datasets["train"]
            plan = train.batch_plan(self.cfg.max_tokens)
            self.padding_efficiency = plan.padding_efficiency
            rank_zero_info(
                f"data: {self.cache_path.name}: {len(train)} train pairs in {len(plan)} "
                f"batches of <= {self.cfg.max_tokens} tokens, padding efficiency "
                f"{self.padding_efficiency:.3f}"
            )

    @property
    def tokenizers(self) -> Tokenizers:
        if self._tokenizers is None:
            self.manifest  # noqa: B018 (raises a clear error when the cache is missing)
            self._tokenizers = Tokenizers.load(self.cache_path)
        return self._tokenizers

    @property
    def src_vocab_size(self) -> int:
        return int(self.manifest["src_vocab_size"])

    @property
    def tgt_vocab_size(self) -> int:
        return int(self.manifest["tgt_vocab_size"])

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _sampler(self, role: str, rank: int, world_size: int) -> TokenBatchSampler:
        if role not in self._datasets:
            self.setup()
        plan = self._datasets[role].batch_plan(self.cfg.max_tokens)
        train = role == "train"
        return TokenBatchSampler(
            plan, train, self.seed, rank, world_size, regroup=train and self.cfg.regroup
        )

    def train_batches(self, world_size: int) -> int:
        """Training batches each of `world_size` ranks takes in an epoch (the same on every
        rank and in every epoch)."""
        return len(self._sampler("train", 0, world_size))

    def _train_batch_sampler(self) -> TokenBatchSampler:
        rank, world_size = self._rank_world()
        sampler = self._train_sampler
        if sampler is None or (sampler.rank, sampler.world_size) != (rank, world_size):
            sampler = self._train_sampler = self._sampler("train", rank, world_size)
        if self._sampler_state is not None:
            sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None
        elif self.trainer is not None:
            sampler.set_epoch(self.trainer.current_epoch)
        return sampler

    def dataloader(self, split: str) -> DataLoader:
        """Loader of `Batch`es for 'train' (shuffled per epoch) or 'val'/'test' (fixed order)."""
        if split not in ROLES:
            raise ValueError(f"split must be one of {ROLES}, got {split!r}")
        sampler = (
            self._train_batch_sampler()
            if split == "train"
            else self._sampler(split, *self._rank_world())
        )
        workers = self.cfg.num_workers
        return DataLoader(
            self._datasets[split],
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=workers,
            persistent_workers=workers > 0 and split == "train",
            pin_memory=self._to_cuda(),
            # its own generator: creating an iterator must not draw from the global RNG, or a
            # resumed run's dropout masks would differ from an uninterrupted run's
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _to_cuda(self) -> bool:
        """Whether batches go to a CUDA device (then they are pinned, for asynchronous copies)."""
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        return self.dataloader("train")

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def _text(self, split: str, side: str) -> list[str]:
        if split not in ROLES:
            raise ValueError(f"split must be one of {ROLES}, got {split!r}")
        if split == "train":  # training reads ids; the cache keeps no train text
            raise DataError(
                "the data cache keeps the train split's token ids, not its text: use the val "
                "or test split here (or score train text with evaluate.py split=train)"
            )
        if split not in self._texts:
            with (self.cache_path / f"{split}.jsonl").open(encoding="utf-8") as file:
                records = [json.loads(line) for line in file]
            self._texts[split] = {k: [r[k] for r in records] for k in ("src", "tgt")}
        return self._texts[split][side]

    def references(self, split: str) -> list[str]:
        """Original target text of each example of split, indexed by `Batch.ids`."""
        return self._text(split, "tgt")

    def sources(self, split: str) -> list[str]:
        """Original source text of each example of split, indexed by `Batch.ids`."""
        return self._text(split, "src")

    def state_dict(self) -> dict[str, dict[str, int]]:
        """The train sampler's position: batches this epoch the trainer has finished (when
        fitting; the loader itself runs ahead by its prefetch), else batches yielded."""
        if self._train_sampler is None:
            return {"train_sampler": self._sampler_state} if self._sampler_state else {}
        state = self._train_sampler.state_dict()
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            state["position"] = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"train_sampler": state}

    def load_state_dict(self, state_dict: dict[str, dict[str, int]]) -> None:
        """Resume the train sampler where the checkpointed run stopped."""
        if "train_sampler" in state_dict:
            self._sampler_state = dict(state_dict["train_sampler"])
            if self._train_sampler is not None:
                self._train_sampler.load_state_dict(self._sampler_state)
                self._sampler_state = None
