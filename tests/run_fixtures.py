"""The tiny trained run that tests/eval and tests/reliability share (trained once per
session, on first use): `run_dir`, its `ckpt`, a `translator` of it, some `sources`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import compose_train

TOY = ["data.toy.train_size=1500", "data.toy.val_size=40", "data.toy.test_size=30"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def data_overrides(cache_dir: Path) -> list[str]:
    """The toy corpus the checkpoint was trained on (for evaluate's data=...)."""
    return ["data=toy", *TOY, f"data.cache_dir={cache_dir}"]


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A finished tiny training run (40 steps: a barely trained model, whose output still
    depends on its input): checkpoints/step{20,40}.ckpt, last.ckpt, averaged.ckpt (of the two
    validations), attention/step{20,40}/*.png, and .hydra/config.yaml."""
    from aiayn.training.run import run

    out = tmp_path_factory.mktemp("run")
    cfg = compose_train(
        [
            "model=tiny",
            *TOY,
            f"data.cache_dir={cache_dir}",
            "callbacks=[default,average,attention]",
            "~callbacks.rich_progress_bar",
            "~callbacks.samples",
            "callbacks.average.last=2",
            "callbacks.model_checkpoint.save_top_k=-1",  # step20.ckpt, step40.ckpt
            "callbacks.model_checkpoint.filename='step{step}'",
            "data.max_tokens=1024",
            "trainer.max_steps=40",
            "optim.warmup_steps=40",  # an output that depends on the input after 40 steps
            "trainer.max_epochs=-1",
            "trainer.val_check_interval=20",
            "trainer.check_val_every_n_epoch=null",
            "trainer.num_sanity_val_steps=0",
            "++trainer.enable_progress_bar=false",
            "++trainer.enable_model_summary=false",
            "logger=csv",
            "test=false",
        ],
        output_dir=out,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # runs before the package-scoped one_thread
    try:
        run(cfg)
    finally:
        torch.set_num_threads(threads)
    (out / ".hydra").mkdir()
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")  # as Hydra does for real runs
    return out


@pytest.fixture(scope="session")
def ckpt(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def translator(ckpt: Path):
    from aiayn.inference import load_checkpoint

    return load_checkpoint(ckpt, "cpu")


@pytest.fixture(scope="session")
def sources(run_dir: Path) -> list[str]:
    """The first toy test sentences (raw text)."""
    from aiayn.data import read_split
    from aiayn.inference.evaluation import run_data_config

    return read_split(run_data_config(run_dir / "checkpoints" / "last.ckpt"), "test")[0][:6]
