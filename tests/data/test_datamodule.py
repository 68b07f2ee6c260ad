"""TranslationDataModule end to end: toy and Multi30k, Batch contents, Lightning, configs."""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from omegaconf import OmegaConf

from aiayn.config import to_schema
from aiayn.data.config import DataConfig
from aiayn.data.datamodule import TranslationDataModule
from aiayn.data.dataset import Batch, collate_sources
from aiayn.data.sampler import PLAN_VERSION, BatchPlan
from aiayn.data.sources import SOURCES
from aiayn.data.special import BOS, EOS, PAD
from aiayn.errors import DataError

CONF_DATA = Path(__file__).resolve().parents[2] / "conf" / "data"


def toy_module(tmp_path: Path, **overrides: object) -> TranslationDataModule:
    settings = {
        "cache_dir": str(tmp_path / "cache"),
        "toy": {"train_size": 400, "val_size": 40, "test_size": 40},
        "max_tokens": 300,
        **overrides,
    }
    cfg = to_schema(OmegaConf.merge(OmegaConf.load(CONF_DATA / "toy.yaml"), settings), DataConfig)
    return TranslationDataModule(cfg, seed=5)


def test_batch_plans_are_built_at_prepare_and_memory_mapped(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    """prepare saves every split's plan for data.max_tokens in the cache; the samplers map it
    (no per-pair array in a rank's memory); another budget gets its own plan on first use;
    where the plan cannot be saved (disk full) it stays in memory with a warning."""
    dm = toy_module(tmp_path)
    dm.prepare_data()
    plans = sorted(p.name for p in dm.cache_path.glob("*.plan-*"))
    assert plans == sorted(
        f"{role}.plan-300.{part}"
        for role in ("train", "val", "test")
        for part in ("order.npy", "bounds.npy", "json")
    )
    dm.setup("fit")
    sampler = dm.train_dataloader().batch_sampler
    assert isinstance(sampler.plan.order, np.memmap)
    assert sorted(i for batch in sampler for i in batch) == list(range(400))

    other = toy_module(tmp_path, max_tokens=600)
    other.setup("fit")  # prepared cache (max_tokens is not in its key), a new budget's plan
    assert (other.cache_path / "train.plan-600.json").is_file()
    assert len(list(other.train_dataloader())) < len(list(dm.train_dataloader()))

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(BatchPlan, "save", disk_full)
    third = toy_module(tmp_path, max_tokens=900)
    third.setup("fit")
    batches = list(third.train_dataloader())
    assert sorted(i for batch in batches for i in batch.ids.tolist()) == list(range(400))
    assert "could not save the batch plan train.plan-900" in caplog.text


def test_a_read_only_cache_is_used_and_an_unwritable_cache_dir_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A complete cache shared read-only (no plan for this budget, no lock directory) is used
    as it is, its plan kept in memory; a cache_dir that cannot be written is one DataError
    naming it, before any work."""
    from aiayn.data import prepare as prepare_module

    dm = toy_module(tmp_path)
    dm.prepare_data()
    for plan in dm.cache_path.glob("*.plan-*"):
        plan.unlink()
    shutil.rmtree(dm.cache_path.parent / ".locks")
    writable = os.access
    monkeypatch.setattr(
        prepare_module.os,
        "access",
        lambda path, mode: False if Path(path) == dm.cache_path else writable(path, mode),
    )
    again = toy_module(tmp_path)
    again.prepare_data()
    assert again.cache_path == dm.cache_path
    assert not (dm.cache_path.parent / ".locks").exists()
    assert not list(dm.cache_path.glob("*.plan-*"))  # prepare wrote nothing

    monkeypatch.setattr(prepare_module.os, "access", lambda path, mode: False)
    fresh = toy_module(tmp_path / "elsewhere")
    with pytest.raises(
        DataError, match=r"cannot prepare the data cache in .*elsewhere.*data\.cache_dir"
    ):
        fresh.prepare_data()


def test_prepare_replaces_a_plan_of_an_older_version(tmp_path: Path) -> None:
    """A cache whose plans an older aiayn wrote (no version in their json) gets current ones
    at prepare, under its lock, rather than from every rank at setup."""
    dm = toy_module(tmp_path)
    dm.prepare_data()
    meta = dm.cache_path / "train.plan-300.json"
    meta.write_text(json.dumps({"padding_efficiency": 0.5}))
    toy_module(tmp_path).prepare_data()
    assert json.loads(meta.read_text())["version"] == PLAN_VERSION


def test_a_split_loads_its_plan_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dm = toy_module(tmp_path)
    dm.prepare_data()
    loads = []
    load = BatchPlan.load
    monkeypatch.setattr(BatchPlan, "load", lambda *a: loads.append(a[1]) or load(*a))
    dm.setup("fit")
    dm.train_dataloader()
    dm.train_dataloader()
    assert loads == ["train.plan-300"]


@pytest.mark.parametrize("name", list(SOURCES))
def test_shipped_yaml_composes(name: str) -> None:
    cfg = to_schema(OmegaConf.load(CONF_DATA / f"{name}.yaml"), DataConfig)
    assert isinstance(cfg, DataConfig) and cfg.source == name


def test_batches_references_and_sources(tmp_path: Path) -> None:
    dm = toy_module(tmp_path)
    with pytest.raises(DataError, match="call prepare_data"):
        _ = dm.src_vocab_size
    dm.prepare_data()
    dm.prepare_data()  # idempotent
    dm.setup("fit")
    assert dm.src_vocab_size == dm.tgt_vocab_size == dm.tokenizers.src_vocab_size
    assert dm.padding_efficiency is not None and dm.padding_efficiency > 0.9
    seen = []
    for split in ("train", "val", "test"):
        for batch in dm.dataloader(split):
            assert isinstance(batch, Batch)
            assert batch.src.shape[0] * max(batch.src.shape[1], batch.tgt_in.shape[1]) <= 300
            assert (batch.tgt_in[:, 0] == BOS).all()
            rows = torch.arange(len(batch.ids))
            assert (batch.tgt_out[rows, batch.tgt_lengths - 1] == EOS).all()
            assert (batch.src[rows, batch.src_lengths - 1] == EOS).all()
            assert batch.num_tgt_tokens == int((batch.tgt_out != PAD).sum())
            assert batch.num_src_tokens == int((batch.src != PAD).sum())
            assert (
                (batch.tgt_in[:, 1:] == batch.tgt_out[:, :-1])
                .logical_or(batch.tgt_out[:, :-1] == EOS)
                .all()
            )
            if split == "train":  # the cache keeps train ids, not text
                continue
            refs = [dm.references(split)[i] for i in batch.ids.tolist()]
            assert dm.tokenizers.decode(batch.tgt_out.tolist(), "tgt") == refs
            srcs = [dm.sources(split)[i] for i in batch.ids.tolist()]
            assert dm.tokenizers.decode(batch.src.tolist(), "src") == srcs
            if split == "val":
                seen.extend(batch.ids.tolist())
    assert sorted(seen) == list(range(40))
    with pytest.raises(DataError, match="keeps the train split's token ids, not its text"):
        dm.references("train")
    src, lengths = collate_sources(dm.tokenizers.encode(dm.sources("val")[:3], "src"))
    first = next(iter(dm.val_dataloader()))
    assert src.shape[0] == 3 and (src[torch.arange(3), lengths - 1] == EOS).all()
    assert first.src.dtype == torch.int64
    moved = move_data_to_device(first, torch.device("cpu"))
    assert isinstance(moved, Batch) and moved.num_src_tokens == first.num_src_tokens


class _Recorder(L.LightningModule):
    """Records the example ids of each training batch; saves the datamodule state at step 2."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.ids: list[list[list[int]]] = []
        self.state: dict | None = None

    def on_train_epoch_start(self) -> None:
        self.ids.append([])

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, Batch)
        self.ids[-1].append(batch.ids.tolist())
        return (self.weight * batch.src.float().mean()).sum()

    def on_train_batch_end(self, outputs: object, batch: Batch, batch_idx: int) -> None:
        if self.current_epoch == 1 and batch_idx == 2:
            self.state = self.trainer.datamodule.state_dict()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("regroup", [False, True])
def test_lightning_epochs_and_resume_position(tmp_path: Path, regroup: bool) -> None:
    """Lightning's epochs each see every pair once: the same batches in a new order, or with
    data.regroup new batches; a resumed run yields exactly the rest of the epoch."""
    dm = toy_module(tmp_path, regroup=regroup)
    module = _Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=dm)
    first, second = module.ids
    assert first != second
    assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b)
    shared = {frozenset(b) for b in first} & {frozenset(b) for b in second}
    assert (len(shared) < len(first) // 2) if regroup else (len(shared) == len(first))
    plan = [PLAN_VERSION, 400, 300, 1, 13]  # version, pairs, max_tokens, shuffled, batches
    assert module.state == {
        "train_sampler": {
            "epoch": 1,
            "position": 3,
            "world_size": 1,
            "batches": 13,
            "plan": plan,
            "regroup": regroup,
        }
    }
    resumed = toy_module(tmp_path, regroup=regroup)
    resumed.prepare_data()
    resumed.load_state_dict(module.state)
    assert [batch.ids.tolist() for batch in resumed.train_dataloader()] == second[3:]


@pytest.fixture(scope="module")
def multi30k(
    multi30k_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> TranslationDataModule:
    node = OmegaConf.merge(
        OmegaConf.load(CONF_DATA / "multi30k.yaml"),
        {"root": str(multi30k_root), "cache_dir": str(tmp_path_factory.mktemp("cache"))},
    )
    dm = TranslationDataModule(to_schema(node, DataConfig))
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_multi30k_padding_efficiency(multi30k: TranslationDataModule) -> None:
    assert multi30k.cfg.max_tokens == 4096
    assert multi30k.padding_efficiency is not None and multi30k.padding_efficiency >= 0.95


def test_multi30k_de_en_direction_has_its_own_cache_and_fits_the_budget(
    multi30k: TranslationDataModule, multi30k_root: Path
) -> None:
    node = OmegaConf.merge(
        OmegaConf.load(CONF_DATA / "multi30k.yaml"),
        {"root": str(multi30k_root), "cache_dir": str(multi30k.cfg.cache_dir)},
        {"src_lang": "de", "tgt_lang": "en"},
    )
    de_en = TranslationDataModule(to_schema(node, DataConfig))
    de_en.prepare_data()
    assert de_en.cache_path != multi30k.cache_path  # the direction is part of the cache key
    english = (multi30k_root / "test2016.en").read_text(encoding="utf-8").splitlines()
    german = (multi30k_root / "test2016.de").read_text(encoding="utf-8").splitlines()
    assert de_en.references("test") == english and de_en.sources("test") == german
    again = TranslationDataModule(to_schema(node, DataConfig))
    again.prepare_data()  # a second run reuses the cache
    assert again.cache_path == de_en.cache_path and again.manifest == de_en.manifest
    de_en.setup("fit")
    for batch in de_en.train_dataloader():
        assert batch.src.numel() <= 4096 and batch.tgt_in.numel() <= 4096


def test_multi30k_round_trip_and_test_split(multi30k: TranslationDataModule) -> None:
    assert len(multi30k.references("test")) == 1000 and len(multi30k.sources("val")) == 1014
    for side, texts in (("src", multi30k.sources("val")), ("tgt", multi30k.references("test"))):
        decoded = multi30k.tokenizers.decode(multi30k.tokenizers.encode(texts, side), side)
        expected = [unicodedata.normalize("NFKC", text).strip() for text in texts]
        assert decoded == expected
