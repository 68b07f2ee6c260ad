"""What a GPU run enforces, checked on the CPU (CI has no GPU): float16 with a GradScaler
through Lightning's mixed-precision plugin (unscaled norms, clipping, skipped updates,
divergence), per-rank GPU generator states, precision and kernel resolution, the pairs of
machine, model and precision that are refused, pinned batches, torch's own kernels off the
CPU, and (slow) DDP and FSDP under NCCL's device rules (`tests.gpu_rules`)."""

from __future__ import annotations

import json
import math
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from aiayn import kernels
from aiayn.errors import ConfigError, DivergedError
from aiayn.training import devices
from aiayn.training.run import build, run, validate
from tests.helpers import cli, cli_overrides, compose_train, csv_metrics, fast_overrides, run_dirs

TOY = ["data.toy.train_size=400", "data.toy.val_size=10", "data.toy.test_size=10"]
MONITOR_LOSS = [
    "callbacks.model_checkpoint.monitor=val/loss",
    "callbacks.model_checkpoint.mode=min",
]


def _module_and_data(tmp_path: Path, *overrides: str):
    cfg = compose_train([*fast_overrides(tmp_path), *TOY, *overrides], tmp_path)
    config = validate(cfg)
    datamodule, module = build(config)
    return datamodule, module


def _fp16_trainer(steps: int, init_scale: float, callbacks=(), **kwargs) -> L.Trainer:
    """A CPU trainer under float16 autocast with a GradScaler, as `16-mixed` is on a GPU
    (torch.amp.GradScaler("cpu"), handed to Lightning's own plugin)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**6)
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kwargs,
    )


class ScaledGradients(L.Callback):
    """Records what the update's gradients are before the module unscales them (callbacks run
    first), what the optimizer steps on, the logged norm, and the weights after each update;
    makes the gradients non-finite at the updates in `poison`."""

    def __init__(self, poison=()) -> None:
        self.poison = set(poison)
        self.unscaled_norms: list[float] = []
        self.stepped_norms: list[float] = []
        self.logged_norms: list[float] = []
        self.weights: list[torch.Tensor] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        optimizer = trainer.optimizers[0]
        optimizer.register_step_pre_hook(self._before_step)

    def _before_step(self, optimizer, args, kwargs) -> None:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        self.stepped_norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        scale = trainer.precision_plugin.scaler.get_scale()
        self.unscaled_norms.append(float(torch.nn.utils.get_total_norm(grads)) / scale)
        if trainer.global_step in self.poison:
            grads[0].view(-1)[0] = float("nan")

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.logged_norms.append(float(pl_module._grad_norm))
        self.weights.append(torch.cat([p.detach().flatten() for p in pl_module.parameters()]))


def test_fp16_grad_scaler_logs_unscaled_norms_and_clips_them(tmp_path):
    """16-mixed with the fused optimizer: Lightning leaves the unscaling to the optimizer, so
    on 9898ab7 the logged norm was the scaled one (x 2**10 here) and clipping raised."""
    datamodule, module = _module_and_data(tmp_path, "model.dropout=0.0")
    spy = ScaledGradients()
    clip = 0.05
    trainer = _fp16_trainer(4, 2.0**10, [spy], gradient_clip_val=clip)
    trainer.fit(module, datamodule=datamodule)
    assert len(spy.logged_norms) == 4
    assert spy.logged_norms == pytest.approx(spy.unscaled_norms, rel=1e-5)
    assert min(spy.unscaled_norms) > clip  # so every update was clipped, to the limit
    assert spy.stepped_norms == pytest.approx([clip] * 4, rel=1e-4)
    assert trainer.precision_plugin.scaler.get_scale() == 2.0**10  # no overflow, no skip


def test_fp16_skipped_updates_are_counted_and_leave_the_weights(tmp_path):
    datamodule, module = _module_and_data(tmp_path, "model.dropout=0.0")
    spy = ScaledGradients(poison={2, 3})
    trainer = _fp16_trainer(6, 16.0, [spy])
    trainer.fit(module, datamodule=datamodule)
    # the scaler skipped updates 2 and 3 and halved its scale at each
    assert trainer.precision_plugin.scaler.get_scale() == 4.0
    assert int(module.guard.skipped) == 2
    assert torch.equal(spy.weights[1], spy.weights[2])
    assert torch.equal(spy.weights[2], spy.weights[3])
    assert not torch.equal(spy.weights[3], spy.weights[4])  # training went on
    assert trainer.callback_metrics["train/skipped_updates"] == 2


def test_fp16_divergence_stops_once_the_scale_is_spent(tmp_path):
    """From update 1 on every update overflows: the scaler's search (scales 16, 8, 4, 2) is
    not divergence; at or below optim.min_loss_scale=1 the updates count (1, 0.5, 0.25), and
    the third passes optim.max_nonfinite_updates=2 at update 7."""
    limits = ["optim.max_nonfinite_updates=2", "optim.min_loss_scale=1.0"]
    datamodule, module = _module_and_data(tmp_path, "model.dropout=0.0", *limits)
    spy = ScaledGradients(poison=set(range(1, 100)))
    trainer = _fp16_trainer(20, 16.0, [spy], log_every_n_steps=1)
    with pytest.raises(DivergedError, match="3 updates in a row up to update 7") as error:
        trainer.fit(module, datamodule=datamodule)
    assert "optim.max_nonfinite_updates=2" in str(error.value)
    assert "last finite loss" in str(error.value) and "at update 0" in str(error.value)
    assert all(torch.equal(spy.weights[0], w) for w in spy.weights[1:])  # nothing moved
    assert int(module.guard.skipped) == 7


def test_bf16_mixed_with_clipping_trains_on_torch_kernels_without_the_cpu_allocator(
    tmp_path, monkeypatch
):
    """The combination that raised at the first update on 9898ab7 (fused Adam + clipping under
    Lightning's mixed precision), run as a GPU runs it (kernels=torch), which never tunes the
    CPU allocator; metrics.json records the precision and the kernels."""

    def refuse(*args):
        raise AssertionError("keep_freed_memory ran under kernels=torch")

    monkeypatch.setattr("aiayn.training.run.keep_freed_memory", refuse)
    overrides = [*fast_overrides(tmp_path), *TOY, "trainer.max_steps=3", "test=false"]
    overrides += ["trainer.precision=bf16-mixed", "trainer.gradient_clip_val=0.5"]
    overrides += ["kernels=torch", "trainer.log_every_n_steps=1", "val_bleu=false"]
    overrides += MONITOR_LOSS
    try:
        metrics = run(compose_train(overrides, tmp_path))
    finally:
        kernels.use("cpu")
    assert metrics["precision"] == "bf16-mixed" and metrics["kernels"] == "torch"
    norms = csv_metrics(tmp_path)["train/grad_norm"]
    assert len(norms) == 3 and all(n > 0 for n in norms)


def test_precision_auto_resolves_by_machine_and_an_explicit_value_wins(monkeypatch):
    gpu = {"accelerator": "auto"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cards = (((9, 0), "bf16-mixed"), ((8, 0), "bf16-mixed"), ((7, 5), "16-mixed"))
    for capability, expected in cards:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert devices.resolve_precision("auto", gpu) == expected
    assert devices.resolve_precision("32-true", gpu) == "32-true"
    assert devices.resolve_precision("auto", {"accelerator": "cpu"}) == "32-true"
    assert kernels.resolve("auto", on_gpu=True) == "gpu"
    assert kernels.resolve("auto", on_gpu=False) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_precision("auto", gpu) == "32-true"


def test_the_run_records_the_resolved_precision_and_kernels(tmp_path):
    cfg = compose_train([*fast_overrides(tmp_path), "trainer.accelerator=cpu"], tmp_path)
    config = validate(cfg)
    assert config.trainer["precision"] == "32-true" and config.kernels == "cpu"
    assert cfg.trainer.precision == "32-true" and cfg.kernels == "cpu"  # the logged config


@pytest.mark.parametrize("native", [False, True], ids=["avx2-no-bf16", "avx512-bf16-or-amx"])
@pytest.mark.parametrize("arch", ["transformer", "rnn"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true"])
def test_each_model_and_precision_runs_or_is_refused_by_key_on_each_cpu_kind(
    native, arch, precision, monkeypatch
):
    """The rule for each CPU kind seen (AVX2 without bf16; AVX-512 BF16 or AMX): float16 is
    refused everywhere on the CPU, the LSTM under bf16-mixed where bf16 is not native (oneDNN
    creates no such LSTM there: the default test layer was red on an AVX2-only CPU). What a
    pair that passes here does on this machine: test_the_pairs_this_cpu_accepts_train."""
    monkeypatch.setattr(devices, "bf16_native", lambda device="cpu": native)
    monkeypatch.setattr(devices, "matmul_flops", lambda *a: 1.0)
    trainer = {"accelerator": "cpu", "precision": precision, "devices": 1}
    refused = precision.startswith("16") or (
        arch == "rnn" and precision == "bf16-mixed" and not native
    )
    if refused:
        with pytest.raises(ConfigError, match=f"trainer.precision={precision}"):
            devices.check(trainer, arch)
    else:
        devices.check(trainer, arch)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "rnn"])
@pytest.mark.parametrize("precision", ["32-true", "64-true", "bf16-mixed", "bf16-true"])
def test_the_pairs_this_cpu_accepts_train(model, precision, tmp_path):
    """Every pair `devices.check` lets through on this machine takes two updates."""
    overrides = [*fast_overrides(tmp_path), *TOY, f"model={model}"]
    overrides += [f"trainer.precision={precision}"]
    overrides += ["trainer.max_steps=2", "test=false", "val_bleu=false"]
    overrides += MONITOR_LOSS
    cfg = compose_train(overrides, tmp_path)
    try:
        validate(cfg)
    except ConfigError as error:
        assert "trainer.precision" in str(error)
        return
    metrics = run(cfg)
    assert metrics["precision"] == precision


def test_every_rank_keeps_its_own_gpu_generator_state(monkeypatch):
    """Two ranks, each with its own (faked) GPU generator: the checkpoint holds both states
    and a resume gives each rank its own; an old checkpoint saved with more GPUs than this
    process sees restores without an IndexError."""
    from aiayn.callbacks.rng import RNGState

    gpu_state = {0: torch.arange(16, dtype=torch.uint8), 1: torch.arange(16, 32, dtype=torch.uint8)}
    rank = {"now": 0}
    restored: list[torch.Tensor] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a: gpu_state[rank["now"]].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, *a: restored.append(state))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def gather(tensor):  # what all_gather returns on every rank: each rank's tensor, stacked
        keep = rank["now"]
        stacked = []
        for r in (0, 1):
            rank["now"] = r
            name = "cuda" if tensor.numel() == 16 else "torch"
            state = gpu_state[r] if name == "cuda" else torch.get_rng_state()
            stacked.append(state.to(torch.int64))
        rank["now"] = keep
        return torch.stack(stacked)

    module = SimpleNamespace(device=torch.device("cpu"), all_gather=gather)
    checkpoint: dict = {}
    trainer = SimpleNamespace(world_size=2, global_rank=0)
    RNGState().on_save_checkpoint(trainer, module, checkpoint)
    assert torch.equal(checkpoint["rng_states"]["cuda_per_rank"][1], gpu_state[1])
    for r in (0, 1):
        callback = RNGState()
        trainer = SimpleNamespace(world_size=2, global_rank=r)
        callback.on_load_checkpoint(trainer, module, checkpoint)
        callback.on_train_batch_start(None, module, None, 0)
        assert torch.equal(restored[-1], gpu_state[r])
    old = {"rng_states": {**checkpoint["rng_states"], "cuda": [gpu_state[1]] * 4}}
    del old["rng_states"]["cuda_device"], old["rng_states"]["cuda_per_rank"]
    callback = RNGState()
    callback.on_load_checkpoint(SimpleNamespace(world_size=1, global_rank=0), module, old)
    callback.on_train_batch_start(None, module, None, 0)
    assert torch.equal(restored[-1], gpu_state[1])


def test_averaging_snapshots_are_kept_by_rank_zero_only(tmp_path):
    from aiayn.callbacks import AverageCheckpoints

    module = torch.nn.Linear(2, 2)
    for zero in (True, False):
        callback = AverageCheckpoints(dirpath=str(tmp_path / str(zero)), last=3, every_n_steps=1)
        strategy = SimpleNamespace(lightning_module_state_dict=module.state_dict)
        trainer = SimpleNamespace(global_step=1, is_global_zero=zero, strategy=strategy)
        callback.on_train_batch_end(trainer, module)
        assert len(callback.snapshots) == (1 if zero else 0)
        snapshot = tmp_path / str(zero) / ".snapshot-step1.pt"
        assert snapshot.is_file() is zero
    saved = torch.load(tmp_path / "True" / ".snapshot-step1.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in module.state_dict().items())


def test_batches_are_pinned_for_a_cuda_device(tmp_path, monkeypatch):
    """Pinned batches copy to a GPU without waiting (Lightning copies with non_blocking); on
    the CPU nothing is pinned."""
    from aiayn.data.dataset import TENSOR_FIELDS

    datamodule, _ = _module_and_data(tmp_path)
    datamodule.setup("fit")
    for device, pinned in (("cpu", False), ("cuda", True)):
        strategy = SimpleNamespace(root_device=torch.device(device))
        fake = SimpleNamespace(strategy=strategy, global_rank=0, world_size=1, current_epoch=0)
        datamodule.trainer = fake
        assert datamodule.train_dataloader().pin_memory is pinned
    datamodule.trainer = None
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self.clone().fill_(7))
    batch = next(iter(datamodule.dataloader("val"))).pin_memory()
    assert all(bool((getattr(batch, name) == 7).all()) for name in TENSOR_FIELDS)


def test_off_the_cpu_the_model_and_loss_run_torchs_own_kernels(monkeypatch):
    """A model on another device (the meta device stands for a GPU here) never reaches the
    CPU kernels, even with them applied (`accelerate(model, "cpu")`): each is replaced by a
    function that fails."""
    from aiayn.kernels import accelerate, dropout, linear, loss
    from aiayn.model import build_model
    from aiayn.training.loss import projected_label_smoothed_loss
    from tests.model.model_helpers import tiny_config

    def fail(*args, **kwargs):
        raise AssertionError("a CPU kernel ran off the CPU")

    monkeypatch.setattr(dropout, "keep_mask", fail)
    monkeypatch.setattr(linear, "onednn_product", fail)
    monkeypatch.setattr(linear, "packed_product", fail)
    monkeypatch.setattr(loss._LabelSmoothedCE, "apply", fail)
    monkeypatch.setattr(loss._ProjectedLabelSmoothedCE, "apply", fail)
    model = build_model(tiny_config(src_vocab_size=50, tgt_vocab_size=50, dropout=0.1))
    model = accelerate(model, "cpu").to("meta").train()
    src = torch.randint(4, 50, (3, 7), device="meta")
    tgt = torch.randint(4, 50, (3, 5), device="meta")
    features = model(src, tgt, features_only=True)
    total, nll = projected_label_smoothed_loss(features, model.output, tgt, 0.1)
    total.backward()
    assert total.device.type == "meta" and nll.shape == ()


def test_torch_kernels_give_the_cpu_kernels_loss_and_gradients():
    """kernels=torch (what GPUs run: F.cross_entropy with label smoothing) and the CPU kernels
    (the blocked loss with the output layer fused) agree on the loss, the NLL and every
    gradient, padding included."""
    from aiayn.model import build_model
    from aiayn.training.loss import projected_label_smoothed_loss
    from tests.model.model_helpers import tiny_config

    torch.manual_seed(0)
    config = tiny_config(src_vocab_size=300, tgt_vocab_size=300)
    model = build_model(config)
    src, tgt = torch.randint(4, 300, (4, 9)), torch.randint(4, 300, (4, 6))
    tgt[1, 4:] = config.pad_id
    results = {}
    try:
        for policy in ("cpu", "torch"):
            kernels.use(policy)
            model.zero_grad()
            features = model(src, tgt, features_only=True)
            total, nll = projected_label_smoothed_loss(features, model.output, tgt, 0.1)
            total.backward()
            grads = [p.grad.clone() for p in model.parameters()]
            results[policy] = (total.detach(), nll, grads)
    finally:
        kernels.use("cpu")
    (a_loss, a_nll, a_grads), (b_loss, b_nll, b_grads) = results["cpu"], results["torch"]
    torch.testing.assert_close(a_loss, b_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a_nll, b_nll, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(a_grads, b_grads, strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)


# What a training step of the emulated GPU run may still do between log steps, and why. A log
# step (Lightning writes its metrics: every trainer.log_every_n_steps updates), the last step
# and validation may read the device and communicate; no other step waits for the device or
# for another rank (issue 48).
ALLOWED_SYNCS = {
    # the batch's copy: on CUDA Lightning passes non_blocking=True (pinned batches); on the
    # CPU it does not, which is all the emulation sees
    "lightning/fabric/utilities/apply_func.py:110 move_data_to_device",
}
ALLOWED_COLLECTIVES = {
    # the update's target tokens summed over ranks (token-normalised gradients): part of the
    # gradients' reduction, an all-reduce of one device number that the host does not wait
    # for (on GPUs NCCL queues it on the device). DDP's own gradient all-reduce runs in C++,
    # and FSDP's all-gathers and reduce-scatters are left out (tests.gpu_rules).
    "all_reduce at aiayn/training/module.py _normalise_gradients",
}


def _quiet_steps(report: Path, rank: int) -> tuple[list[dict], list[dict]]:
    """(the steps between log steps, the log steps) of a GpuRules report, after the first step
    (which also builds the optimizer state) and without the last (the run ends there)."""
    recorded = json.loads(Path(f"{report}.rank{rank}.json").read_text())
    assert recorded["tested_under_inference_mode"]
    steps = [s for s in recorded["steps"][1:] if not s["last"]]
    return [s for s in steps if not s["log_step"]], [s for s in steps if s["log_step"]]


def _breaches(steps: list[dict]) -> list[str]:
    """What `steps` (between log steps) did beyond ALLOWED_SYNCS and ALLOWED_COLLECTIVES (each
    allowed collective once per step)."""
    found = []
    for step in steps:
        syncs = {sync.split(" at ", 1)[1] for sync in step["syncs"]}
        found += [f"update {step['update']}: {s}" for s in sorted(syncs - ALLOWED_SYNCS)]
        # the place without its line number: module.py is edited often
        places = [re.sub(r":\d+ ", " ", c) for c in step["collectives"]]
        extra = [p for p in places if p not in ALLOWED_COLLECTIVES or places.count(p) > 1]
        found += [f"update {step['update']}: {c}" for c in sorted(set(extra))]
    return found


def _gpu_rules_args(tmp_path: Path, report: Path) -> list[str]:
    """A run as a GPU runs it (kernels=torch, float32) under tests.gpu_rules: 8 updates,
    Lightning's log steps at updates 4 and 8, a progress bar, validation after the last."""
    args = [*cli_overrides(tmp_path), *TOY, "trainer.max_steps=8", "trainer.max_epochs=-1"]
    args += ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=8"]
    args += ["trainer.log_every_n_steps=4", "trainer.accelerator=cpu", "kernels=torch"]
    args += ["trainer.gradient_clip_val=1.0", "trainer.enable_progress_bar=true"]
    args += ["+callbacks.gpu_rules._target_=tests.gpu_rules.GpuRules"]
    return [*args, f"+callbacks.gpu_rules.report={report}"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_process_training_keeps_nccls_rules(strategy, tmp_path):
    """DDP (with the averaging, EMA and attention-map callbacks, a time budget and the
    cooldown by its clock too) and FSDP on two gloo processes, as a GPU runs them, with every
    collective refusing host tensors, the test split under inference_mode, and each training
    step's host-device synchronisations and collectives recorded: between log steps none
    remain but the batch's copy and the gradients' reduction (ALLOWED_SYNCS,
    ALLOWED_COLLECTIVES). On 9898ab7 the throughput callback's CPU tensor failed the first
    step's all-reduce; before issue 48 every step read the progress bar's loss, broadcast
    Lightning's SIGTERM flag, the time budget's stop flag and the cooldown's clock, summed
    the logged metrics over ranks and broadcast DDP's buffers."""
    report = tmp_path / "syncs"
    args = [*_gpu_rules_args(tmp_path, report), "trainer.devices=2"]
    if strategy == "fsdp":  # the callbacks that keep whole weights are refused under fsdp
        args += ["trainer=fsdp", "callbacks=default"]
    else:  # every callback that keeps or reads weights, under the same rules
        args += ["trainer.strategy=ddp", "callbacks=[default,average,ema,attention]"]
        args += ["test_ckpt=averaged"]
        # the cooldown by the clock: rank 0's share of the time budget, read at log steps
        args += ["optim.cooldown=0.5", "trainer.max_time=00:00:30:00"]
    result = cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    assert json.loads((run_dir / "metrics.json").read_text())["kernels"] == "torch"
    for rank in (0, 1):
        quiet, logged = _quiet_steps(report, rank)
        assert len(quiet) >= 4 and len(logged) >= 1
        assert _breaches(quiet) == []
        # the log step reads the device and sums the metrics over ranks (the rules see both)
        assert all(step["syncs"] and len(step["collectives"]) > 1 for step in logged)


@pytest.mark.slow
def test_one_process_training_reads_the_device_at_log_steps_only(tmp_path):
    """One process, as on one GPU, under the same rules (no collective at all), with the
    weight-keeping callbacks, a time budget with the cooldown by its clock, and Rich's
    progress bar: between log steps nothing but the batch's copy."""
    report = tmp_path / "syncs"
    args = [*_gpu_rules_args(tmp_path, report), "trainer.devices=1"]
    args += ["callbacks=[default,average,ema,attention]", "test_ckpt=averaged"]
    args += ["+callbacks.rich_progress_bar._target_=lightning.pytorch.callbacks.RichProgressBar"]
    args += ["optim.cooldown=0.5", "trainer.max_time=00:00:30:00"]
    result = cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    quiet, logged = _quiet_steps(report, 0)
    assert len(quiet) >= 4 and len(logged) >= 1
    assert _breaches(quiet) == []
    assert all(not step["collectives"] for step in quiet + logged)
    assert all(step["syncs"] for step in logged)  # where the loss is read, and logged


@pytest.mark.slow
@pytest.mark.parametrize("ranks", ["1", "0-1"], ids=["rank 1", "both ranks"])
def test_a_sigterm_stops_every_rank_at_the_next_log_step(ranks, tmp_path):
    """SIGTERM at the start of update 6 to rank 1 alone (no launcher passes it on from there)
    or to both: the ranks agree on it at the next log step, update 8, every rank stops after
    it, the checkpoint of update 8 is written (every rank takes part), and the run exits 143
    with one line saying where it stopped and how to resume, its metrics.json marked
    unfinished. Under Lightning's own handling (a broadcast in its signal handler and one at
    every step) both runs, and one signalled on rank 0, ended in "another process of this
    2-process run died"; on f5393e6 the stop exited 0 with no metrics.json."""
    args = [*cli_overrides(tmp_path), *TOY, "trainer.max_steps=12", "trainer.max_epochs=-1"]
    args += ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=12"]
    args += ["trainer.log_every_n_steps=4", "trainer.accelerator=cpu", "trainer.devices=2"]
    args += ["+callbacks.term._target_=tests.training.callbacks.TermAtStep"]
    args += ["+callbacks.term.step=5"]
    if ranks == "1":
        args += ["+callbacks.term.rank=1"]
    result = cli(args, tmp_path, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "[rank: 1] Received SIGTERM" in output
    assert "SIGTERM: every process stops after update 8" in output
    (run_dir,) = run_dirs(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: SIGTERM stopped the run while training, at update 8; resume with "
        f"ckpt_path={last} (update 8)"
    ]
    assert torch.load(last, weights_only=True)["global_step"] == 8
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["finished"] is False and metrics["stopped_by"] == "SIGTERM"
    assert metrics["updates"] == 8 and metrics["last_checkpoint_update"] == 8
    assert csv_metrics(run_dir)["step"] == [3.0, 7.0]  # the log steps of updates 4 and 8


@pytest.mark.slow
def test_a_sigterm_in_the_test_of_two_processes_is_noted_and_the_test_completed(tmp_path):
    """SIGTERM to rank 1 at the test's first batch: no collective in the signal handler (on
    f5393e6, Lightning's broadcast there met another collective: a hang or "another process
    died"); the test is completed and the run ends as finished."""
    args = [*cli_overrides(tmp_path), *TOY, "trainer.max_steps=4", "trainer.max_epochs=-1"]
    args += ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=4"]
    args += ["trainer.accelerator=cpu", "trainer.devices=2", "test=true"]
    args += ["+callbacks.term._target_=tests.training.callbacks.TermInTest"]
    args += ["+callbacks.term.rank=1"]
    result = cli(args, tmp_path, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "[rank: 1] Received SIGTERM" in output
    assert "SIGTERM during the test: the test was completed first" in output
    (run_dir,) = run_dirs(tmp_path)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["finished"] is True and "test/bleu" in metrics["test"]


def test_a_short_training_run_has_the_same_loss_curve_on_either_kernels(tmp_path):
    """kernels=torch (the GPU's code path) and kernels=cpu train the same: the same logged
    losses, update by update (no dropout: the two draw their masks from different streams)."""
    curves = {}
    try:
        for policy in ("torch", "cpu"):
            out = tmp_path / policy
            overrides = [*fast_overrides(out), *TOY, "trainer.max_steps=12", "test=false"]
            overrides += [f"kernels={policy}", "model.dropout=0.0", "val_bleu=false"]
            overrides += ["trainer.log_every_n_steps=1", *MONITOR_LOSS]
            run(compose_train(overrides, out))
            curves[policy] = csv_metrics(out)["train/loss"]
    finally:
        kernels.use("cpu")
    assert len(curves["cpu"]) == 12
    assert curves["torch"] == pytest.approx(curves["cpu"], rel=1e-4)


def test_fp16_with_accumulation_keeps_its_first_updates(tmp_path):
    """16-mixed with gradient accumulation at GradScaler's default initial scale (65 536):
    each micro-batch back-propagates its loss weighted by its share of the micro-batch token
    budget (at most its mean), not summed over its tokens, so the scaled gradients stay in
    float16's range and the first updates are kept (issue 49: on f5393e6 they overflowed,
    and the scaler skipped about a dozen updates while the warmup advanced)."""
    datamodule, module = _module_and_data(tmp_path, "model.dropout=0.0")
    before = torch.cat([p.detach().flatten().clone() for p in module.parameters()])
    trainer = _fp16_trainer(3, 2.0**16, accumulate_grad_batches=2)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 3 and int(module.guard.skipped) == 0
    assert trainer.precision_plugin.scaler.get_scale() == 2.0**16  # no overflow, no halving
    assert math.isfinite(float(module._grad_norm)) and float(module._grad_norm) > 0
    after = torch.cat([p.detach().flatten() for p in module.parameters()])
    assert not torch.equal(before, after)
