"""`init_from=<ckpt>`: a new run from a checkpoint's weights and tokenizer, with a fresh
optimizer, schedule and data position; a model that does not fit is refused by key."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.data.tokenizer import Tokenizers
from aiayn.inference.checkpoint import model_weights, read_checkpoint
from aiayn.training.run import build, validate
from tests.helpers import CONFIG_ERRORS, cli, cli_overrides, compose_train, launch, run_dirs


def test_fine_tuning_starts_from_the_checkpoints_weights_and_tokenizer(ckpt, tmp_path):
    overrides = ["model=tiny", f"init_from={ckpt}", "data.toy.train_size=300"]
    config = validate(compose_train(overrides, output_dir=tmp_path))
    _, module = build(config)
    saved = read_checkpoint(ckpt)
    expected = model_weights(saved)
    got = module.model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():  # no weight changed before the first step
        assert torch.equal(got[key], value), key
    assert module.tokenizers.state() == Tokenizers.from_state(saved["tokenizers"]).state()


@pytest.mark.slow
def test_fine_tuning_run_has_a_fresh_optimizer_and_its_own_directory(ckpt, tmp_path):
    steps = ["trainer.max_steps=4", "trainer.max_epochs=-1", "trainer.val_check_interval=4"]
    steps += ["trainer.check_val_every_n_epoch=null", "test=false"]
    overrides = [*cli_overrides(tmp_path), "model=tiny", f"init_from={ckpt}", *steps]
    proc = cli(overrides, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = run_dirs(tmp_path)
    new = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert new["global_step"] == 4  # counted from 0: not the checkpoint's 40
    (adam,) = new["optimizer_states"]
    assert all(int(s["step"]) == 4 for s in adam["state"].values())
    assert json.loads((run / "metrics.json").read_text())["fit"]["val/loss"] > 0
    assert read_checkpoint(ckpt)["global_step"] == 40  # the source is untouched


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["lightning", "torchrun"], ids=["2 processes", "3 processes"])
def test_fine_tuning_on_several_processes_prepares_the_data_once(launcher, ckpt, tmp_path):
    """`init_from` under DDP (2 gloo processes of Lightning's launcher, or 3 one-process
    torchrun "nodes": Lightning's launcher takes no more processes than cores): every rank
    writes the checkpoint's tokenizer into the run directory (atomically, the same bytes), and
    the data cache, keyed by its content, is prepared once and shared (issue 49: on f5393e6 the
    second rank's rewrite changed the key and it prepared the whole corpus again)."""
    steps = ["trainer.max_steps=2", "trainer.max_epochs=-1", "trainer.val_check_interval=2"]
    steps += ["trainer.check_val_every_n_epoch=null", "test=false"]
    overrides = [*cli_overrides(tmp_path), "model=tiny", f"init_from={ckpt}", *steps]
    overrides += ["trainer.accelerator=cpu", "trainer.strategy=ddp"]
    if launcher == "lightning":
        proc = cli([*overrides, "trainer.devices=2"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs = [proc.stdout + proc.stderr]
    else:
        nodes = ["trainer.devices=1", "trainer.num_nodes=3"]
        results = launch("torchrun", [*overrides, *nodes], count=3)
        assert [code for code, _, _ in results] == [0, 0, 0], results[0][1][-3000:]
        outputs = [output for _, output, _ in results]
    output = "".join(outputs)
    assert output.count("prepared data cache") == 1, output[-3000:]
    caches = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("toy-en-de-")]
    assert len(caches) == 1, caches
    (run,) = run_dirs(tmp_path)
    assert (run / "init_tokenizer" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["model.d_ff=48"], "has model.d_ff="),
        (["ckpt_path={ckpt}"], "give one of them"),
        (["data.tokenizer.path=tok.json"], "drop data.tokenizer.path"),
    ],
)
def test_what_cannot_fine_tune_is_refused_by_key(ckpt, extra, message, tmp_path):
    overrides = ["model=tiny", f"init_from={ckpt}", *(e.format(ckpt=ckpt) for e in extra)]
    with pytest.raises(CONFIG_ERRORS, match=message):
        validate(compose_train(overrides, output_dir=tmp_path))
