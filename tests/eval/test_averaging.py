"""Checkpoint averaging: the elementwise mean, loadable and translating; --last N; the
end-of-training callback equals averaging the validation checkpoints."""

from __future__ import annotations

import pytest
import torch

from aiayn.cli.average import main
from aiayn.errors import AveragingError
from aiayn.inference import load_checkpoint
from aiayn.inference.averaging import average_checkpoints, average_state_dicts, last_checkpoints
from tests.eval.conftest import reference_translations


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_two_checkpoints_average_elementwise_and_translate(ckpt, sources, tmp_path):
    a = _load(ckpt)
    b = dict(a)
    generator = torch.Generator().manual_seed(0)
    b["state_dict"] = {
        k: v + torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
        for k, v in a["state_dict"].items()
    }
    torch.save(b, tmp_path / "b.ckpt")
    out = tmp_path / "avg.ckpt"
    main([str(ckpt), str(tmp_path / "b.ckpt"), "-o", str(out)])
    avg = _load(out)
    assert avg["averaged_from"] == [str(ckpt), str(tmp_path / "b.ckpt")]
    assert "optimizer_states" not in avg and avg["hyper_parameters"] == a["hyper_parameters"]
    for key, value in a["state_dict"].items():
        mean = (value + b["state_dict"][key]) / 2 if value.is_floating_point() else value
        torch.testing.assert_close(avg["state_dict"][key], mean, rtol=0, atol=1e-6)
    translator = load_checkpoint(out, "cpu")
    got = translator.translate(sources[:2])
    assert got == reference_translations(translator, sources[:2]) and all(got)


def test_a_checkpoint_from_before_a_model_field_existed_averages_with_newer_ones(ckpt, tmp_path):
    """A run resumed across a release that added a ModelConfig field (its key missing from the
    older checkpoints, the default in the newer) averages; other hyper-parameters are
    refused."""
    a = _load(ckpt)
    model = a["hyper_parameters"]["model"]
    assert model["linear_bias"] is True and model["norm_bias"] is True  # their defaults
    older = {k: v for k, v in model.items() if k not in ("linear_bias", "norm_bias")}
    torch.save({**a, "hyper_parameters": {**a["hyper_parameters"], "model": older}}, tmp_path / "o")
    avg = average_checkpoints([tmp_path / "o", ckpt])
    assert avg["hyper_parameters"] == a["hyper_parameters"]  # the newest's
    other = {**model, "norm_bias": False}
    torch.save({**a, "hyper_parameters": {**a["hyper_parameters"], "model": other}}, tmp_path / "n")
    with pytest.raises(AveragingError, match="other model hyper-parameters than"):
        average_checkpoints([tmp_path / "n", ckpt])
    with pytest.raises(AveragingError, match="other model hyper-parameters than"):
        average_checkpoints([ckpt, tmp_path / "n"])


def test_last_n_by_step(run_dir):
    paths = last_checkpoints(run_dir / "checkpoints", 2)
    assert [_load(p)["global_step"] for p in paths] == [20, 40]
    with pytest.raises(AveragingError, match="2 checkpoints of distinct steps, fewer than 5"):
        last_checkpoints(run_dir / "checkpoints", 5)


def test_callback_writes_mean_of_validation_snapshots(run_dir, sources):
    directory = run_dir / "checkpoints"
    averaged = _load(directory / "averaged.ckpt")
    expected = average_checkpoints([directory / "step20.ckpt", directory / "step40.ckpt"])
    last = _load(directory / "last.ckpt")
    assert averaged["averaged_from"] == ["step 20", "step 40"]
    assert averaged["tokenizers"] == last["tokenizers"]
    assert averaged["hyper_parameters"] == last["hyper_parameters"]
    differs = False
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(averaged["state_dict"][key], value, rtol=0, atol=1e-6)
        differs |= not torch.equal(value, last["state_dict"][key])
    assert differs  # not just the last weights
    translator = load_checkpoint(directory / "averaged.ckpt", "cpu")
    for name, weight in translator.model.state_dict().items():  # the averaged weights load
        torch.testing.assert_close(weight, expected["state_dict"][f"model.{name}"])


def test_mismatched_states_are_rejected():
    with pytest.raises(AveragingError, match=r"w: shape \(3,\) in state 1 but \(2,\) in state 0"):
        average_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])
    with pytest.raises(AveragingError, match="differs in keys"):
        average_state_dicts([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}])


def test_the_callback_keeps_the_weights_and_lets_its_snapshots_go(tmp_path):
    """A real Trainer, validating every 2 of 6 updates with `last=2`: the file holds the mean
    of the weights at updates 4 and 6 (the final weights, taken once), the module keeps its
    final weights, and the snapshot files are deleted once the average is written."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from aiayn.callbacks import AverageCheckpoints

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)

        def training_step(self, batch, _):
            return (self.layer(batch[0]) - 1).pow(2).mean()

        def validation_step(self, batch, _):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Seen(L.Callback):
        def __init__(self) -> None:
            self.states: list[dict[str, torch.Tensor]] = []

        def on_validation_end(self, trainer, pl_module) -> None:
            self.states.append({k: v.clone() for k, v in pl_module.state_dict().items()})

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(12, 3)), batch_size=2)
    seen, average = Seen(), AverageCheckpoints(dirpath=str(tmp_path), last=2)
    module = Tiny()
    trainer = L.Trainer(
        max_steps=6, val_check_interval=2, num_sanity_val_steps=0, callbacks=[seen, average],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(module, data, data)
    assert len(seen.states) == 3 and len(average.snapshots) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["averaged.ckpt"]  # snapshots deleted
    averaged = _load(tmp_path / "averaged.ckpt")
    assert averaged["averaged_from"] == ["step 4", "step 6"]
    for key, final in module.state_dict().items():
        torch.testing.assert_close(final, seen.states[-1][key], rtol=0, atol=0)
        mean = (seen.states[1][key] + seen.states[2][key]) / 2
        torch.testing.assert_close(averaged["state_dict"][key], mean, rtol=0, atol=1e-7)
        assert not torch.equal(averaged["state_dict"][key], final)


def test_a_resume_takes_up_the_snapshots_up_to_its_step(tmp_path):
    """Snapshot files of steps 2, 4, 6 and 8, a run resumed at step 6 with `last=2`: it takes
    up 4 and 6 (2 is beyond the window, 8 after the resumed checkpoint: both deleted), and
    its next snapshot pushes 4 out. A fresh run (step 0) deletes every snapshot it finds."""
    from types import SimpleNamespace

    from aiayn.callbacks import AverageCheckpoints

    for step in (2, 4, 6, 8):
        torch.save({"w": torch.full((2,), float(step))}, tmp_path / f".snapshot-step{step}.pt")
    (tmp_path / "other.pt").write_bytes(b"")  # not a snapshot: left alone
    callback = AverageCheckpoints(dirpath=str(tmp_path), last=2, every_n_steps=1)
    module = torch.nn.Linear(2, 2)
    strategy = SimpleNamespace(lightning_module_state_dict=module.state_dict)
    trainer = SimpleNamespace(global_step=6, is_global_zero=True, strategy=strategy)
    callback.on_train_start(trainer, None)
    assert [step for step, _ in callback.snapshots] == [4, 6]
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {".snapshot-step4.pt", ".snapshot-step6.pt", "other.pt"}
    trainer.global_step = 7
    callback.on_train_batch_end(trainer, module)
    assert [step for step, _ in callback.snapshots] == [6, 7]
    assert not (tmp_path / ".snapshot-step4.pt").exists()
    fresh = AverageCheckpoints(dirpath=str(tmp_path), last=2)
    fresh.on_train_start(SimpleNamespace(global_step=0, is_global_zero=True), None)
    assert not fresh.snapshots and {p.name for p in tmp_path.iterdir()} == {"other.pt"}


def test_tied_weights_are_averaged_once_and_stay_tied():
    """Keys that hold one tensor in every state (the model's tied embeddings and output layer)
    are summed once and share one tensor in the mean, which torch.save writes once; a tie
    that a later state breaks is averaged key by key."""
    states = []
    for scale in (1.0, 3.0, 5.0):
        shared = torch.full((2, 3), scale)
        bias = torch.full((3,), scale)
        states.append({"src": shared, "tgt": shared, "out": shared, "bias": bias})
    states[2]["out"] = torch.full((2, 3), 8.0)  # untied in the last state only
    mean = average_state_dicts(iter(states))
    assert list(mean) == ["src", "tgt", "out", "bias"]
    torch.testing.assert_close(mean["src"], torch.full((2, 3), 3.0), rtol=0, atol=0)
    torch.testing.assert_close(mean["out"], torch.full((2, 3), 4.0), rtol=0, atol=0)
    torch.testing.assert_close(mean["bias"], torch.full((3,), 3.0), rtol=0, atol=0)
    assert mean["src"] is mean["tgt"] and mean["out"] is not mean["src"]
