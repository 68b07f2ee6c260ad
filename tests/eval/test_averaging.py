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
    with pytest.raises(AveragingError, match=r"w: shape \(2,\) in state 0 but \(3,\)"):
        average_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])
    with pytest.raises(AveragingError, match="differs in keys"):
        average_state_dicts([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}])
