"""`python train.py` end to end on tiny settings: learning, run directory, checkpoints,
loggers, precision."""

import json

import pytest
import torch

from aiayn.inference import load_checkpoint
from aiayn.training.checkpoint_io import AtomicCheckpointIO
from aiayn.training.loss import label_smoothed_loss
from aiayn.training.module import TranslationModule
from tests.helpers import (
    SIXTY_STEPS,
    assert_loss_fell,
    cli,
    cli_overrides,
    compose_train,
    csv_metrics,
    fast_overrides,
    run_dirs,
)

SHORT = ["data.toy.train_size=2000", "data.toy.val_size=100", "data.toy.test_size=100"]

VARIANT_PRESETS = ["torch_default", "seed000", "seed001", "seed002", "seed003", "seed004", "rnn"]


def test_label_smoothed_loss_matches_torch_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.tensor([[4, 5, 6, 0, 0], [7, 8, 9, 10, 2]])
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    ref = torch.nn.functional.cross_entropy(
        logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=0.1
    )
    ref_nll = torch.nn.functional.cross_entropy(
        logits.view(-1, 11), target.view(-1), ignore_index=0
    )
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    changed = logits.clone()
    changed[0, 3:] = 100.0  # logits at padded positions do not matter
    assert label_smoothed_loss(changed, target, 0.1)[0].item() == pytest.approx(loss.item())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_label_smoothed_loss_gradient_equals_torchs(dtype):
    """The hand-written backward against autograd through torch's cross-entropy (padding rows
    get zero gradient), and gradcheck in float64."""
    torch.manual_seed(1)
    target = torch.tensor([[4, 5, 6, 0, 0], [7, 8, 9, 10, 2]])
    logits = (3 * torch.randn(2, 5, 11, dtype=torch.float64)).to(dtype).requires_grad_()
    label_smoothed_loss(logits, target, 0.1)[0].backward()
    reference = logits.detach().clone().requires_grad_()
    torch.nn.functional.cross_entropy(
        reference.float().view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=0.1
    ).backward()
    assert logits.grad.dtype == dtype
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(logits.grad.float(), reference.grad.float(), atol=tolerance, rtol=0)
    assert logits.grad[0, 3:].abs().sum() == 0
    if dtype == torch.float64:
        fresh = logits.detach().clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda x: label_smoothed_loss(x, target, 0.2)[0], fresh)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothed_loss_in_row_blocks_equals_it_whole(dtype, monkeypatch):
    """The forward pass's log-sum-exp is taken a block of rows at a time (blocks of 3 rows
    here, the last one short): loss, NLL and gradient equal torch's cross-entropy."""
    from aiayn.kernels import loss as module

    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 3 * 11)
    torch.manual_seed(2)
    target = torch.tensor([[4, 5, 6, 0, 0], [7, 8, 9, 10, 2]])
    logits = (3 * torch.randn(2, 5, 11)).to(dtype).requires_grad_()
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    loss.backward()
    reference = logits.detach().float().requires_grad_()
    flat, gold = reference.view(-1, 11), target.view(-1)
    ref = torch.nn.functional.cross_entropy(flat, gold, ignore_index=0, label_smoothing=0.1)
    ref.backward()
    ref_nll = torch.nn.functional.cross_entropy(flat, gold, ignore_index=0)
    assert loss.dtype == nll.dtype == torch.float32
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(logits.grad.float(), reference.grad, atol=tolerance, rtol=0)


def test_atomic_checkpoint_write_never_replaces_a_good_file_with_a_partial_one(
    tmp_path, monkeypatch
):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)

    def dies_midway(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {"step": 1}


@pytest.mark.slow
def test_train_cli_learns_the_toy_task_and_writes_the_run_directory(tmp_path):
    """A tiny model learns the toy corpus far above its starting BLEU; the run directory has
    .hydra/, best/last checkpoints, tokenizer.json, metrics.json and the CSV log."""
    result = cli(
        [
            *cli_overrides(tmp_path),
            *SHORT,
            "trainer.max_epochs=8",
            "trainer.check_val_every_n_epoch=2",
            "optim.warmup_steps=200",
            "data.max_tokens=512",
            "model.dropout=0.0",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "tokenizer.json", "metrics.json"):
        assert (run / name).is_file(), name
    assert (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["best_checkpoint"].endswith("best.ckpt")
    assert metrics["parameters"]["total"] > 0
    assert metrics["test"]["test/bleu"] > 60.0, metrics
    assert "test/bleu" in result.stdout
    logged = csv_metrics(run)
    for key in (
        "train/loss",
        "train/ppl",
        "train/lr",
        "train/tokens_per_sec",
        "train/mfu",
        "train/grad_norm",
        "val/loss",
        "val/ppl",
        "val/bleu",
        "test/bleu",
        "train/peak_rss_mib",
    ):
        assert logged[key], key
    peaks = logged["train/peak_rss_mib"]  # a high-water mark: never falls, the run's is above
    assert peaks == sorted(peaks) and 100 < peaks[0] <= peaks[-1] <= metrics["peak_rss_mib"]
    bleus = logged["val/bleu"]
    assert bleus[-1] > bleus[0] + 40, bleus
    assert all(0.0 < mfu < 1.5 for mfu in logged["train/mfu"]), logged["train/mfu"]

    # a checkpoint alone is enough to translate: weights, config and tokenizer travel in it;
    # the toy grammar has one right answer, which a model at BLEU > 60 mostly finds
    from aiayn.data.toy import generate_pairs

    pairs = generate_pairs(30, seed=99)
    translator = load_checkpoint(run / "checkpoints" / "best.ckpt", "cpu")
    hyps = translator.translate([en for en, _ in pairs])
    exact = sum(hyp == de for hyp, (_, de) in zip(hyps, pairs, strict=True))
    assert exact >= 15, list(zip(hyps, pairs, strict=True))[:5]
    module = TranslationModule.load_from_checkpoint(run / "checkpoints" / "best.ckpt")
    assert module.translator.translate([pairs[0][0]]) == hyps[:1]  # one decode path


@pytest.mark.slow
def test_bf16_mixed_precision_trains_on_cpu(tmp_path):
    result = cli(
        [
            *cli_overrides(tmp_path),
            *SHORT,
            "trainer.precision=bf16-mixed",
            *SIXTY_STEPS,
            "data.max_tokens=512",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    losses = csv_metrics(run)["train/loss"]
    assert_loss_fell(losses, by=1.0)
    assert "bfloat16 Automatic Mixed Precision" in result.stdout + result.stderr


@pytest.mark.slow  # a train.py process (~8 s of imports on a slow 2-core machine)
def test_config_error_exits_with_a_clear_message(tmp_path):
    result = cli([*cli_overrides(tmp_path), "model.num_heads=3"], tmp_path)
    assert result.returncode != 0
    assert "num_heads" in result.stderr
    assert "Traceback" not in result.stderr


def _wandb_log(run_dir):
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return log


@pytest.mark.slow  # ~25 s: W&B's service process and 20 updates with two validations
def test_wandb_offline_run_holds_metrics_samples_config_and_summary(tmp_path):
    from tests.helpers import read_wandb_records, wandb_history

    with_attention = [
        "callbacks=[default,attention]" if o == "callbacks=default" else o
        for o in cli_overrides(tmp_path)
    ]
    result = cli(
        [
            *with_attention,
            *SHORT,
            "logger=wandb",
            "trainer.max_steps=20",
            "trainer.max_epochs=-1",
            "trainer.val_check_interval=10",
            "trainer.check_val_every_n_epoch=null",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    # attention heatmaps went to W&B as images (per kind and layer) and into the run directory
    images = list(run.glob("wandb/offline-run-*/files/media/images/attention/*.png"))
    assert {p.name.split("_layer")[0] for p in images} == {
        "encoder_self",
        "decoder_self",
        "decoder_cross",
    }
    drawn = sorted(p.relative_to(run / "attention").as_posix() for p in run.glob("attention/*/*"))
    assert {p.split("/")[0] for p in drawn} == {"step10", "step20"}
    assert {p.split("/")[1] for p in drawn} == {p.name.rsplit("_", 2)[0] + ".png" for p in images}
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [10, 20] and len(samples[0]["samples"]) == 8
    log = _wandb_log(run)
    history = wandb_history(log)
    for key in (
        "train/loss",
        "train/lr",
        "train/tokens_per_sec",
        "train/mfu",
        "val/bleu",
        "val/ppl",
        "test/bleu",
    ):
        assert key in history, key
    assert len(history["val/bleu"]) == 2
    assert "val/samples/_type" in history  # the table of sample translations
    tables = list(run.glob("wandb/offline-run-*/files/media/table/val/samples_*.table.json"))
    assert len(tables) == 2  # one per validation
    data = json.loads(tables[0].read_text())
    assert len(data["data"]) == 8 and all(len(row) == 4 for row in data["data"])
    assert data["columns"] == ["step", "source", "reference", "hypothesis"]
    records = read_wandb_records(log)
    kinds = [r.WhichOneof("record_type") for r in records]
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert any(m.name == "val/bleu" and m.summary.max for m in metrics)
    config = {
        i.key for r in records if r.WhichOneof("record_type") == "config" for i in r.config.update
    }
    assert {"config", "parameters", "model", "optim"} <= config
    summary = {
        i.key for r in records if r.WhichOneof("record_type") == "summary" for i in r.summary.update
    }
    assert "parameters/total" in summary
    (exit_record,) = [r.exit for r, k in zip(records, kinds, strict=True) if k == "exit"]
    assert exit_record.exit_code == 0


@pytest.mark.slow
def test_a_failing_job_still_finishes_its_wandb_run(tmp_path):
    from tests.helpers import read_wandb_records

    result = cli(
        [
            *cli_overrides(tmp_path),
            *SHORT,
            "logger=wandb",
            "trainer.max_steps=20",
            "+callbacks.fail._target_=tests.training.callbacks.FailAtStep",
            "+callbacks.fail.step=3",
        ],
        tmp_path,
    )
    assert result.returncode != 0
    assert "injected failure" in result.stderr
    (run,) = run_dirs(tmp_path)
    records = read_wandb_records(_wandb_log(run))
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert len(exits) == 1 and exits[0].exit_code == 1


def test_validation_decodes_with_val_decode_on_top_of_decode():
    from dataclasses import asdict

    from aiayn.model import DecodeConfig, ModelConfig

    model = asdict(ModelConfig(50, 50, d_model=16, num_heads=2, num_encoder_layers=1))
    decode = {"strategy": "beam", "beam_size": 3}
    module = TranslationModule(
        model=model, optim={}, decode=decode, val_decode={"strategy": "greedy", "max_len_b": 5}
    )
    val = module.decode_settings("val")
    assert (val.strategy, val.beam_size, val.max_len_b) == ("greedy", 3, 5)
    assert module.decode_settings("test") == DecodeConfig(**decode)  # and in checkpoints
    old = TranslationModule(model=model, optim={}, decode=decode)  # saved without val_decode
    assert old.decode_settings("val") == old.decode_settings("test") == DecodeConfig(**decode)


@pytest.mark.slow
def test_last_checkpoint_is_also_written_on_a_time_interval(tmp_path):
    """Killed mid-epoch with no validation yet, the run lost nothing but the update in
    flight: last.ckpt was written on the (here tiny) time interval."""
    import signal

    steps = ["trainer.max_steps=30", "trainer.max_epochs=-1", "trainer.val_check_interval=30"]
    steps += ["trainer.check_val_every_n_epoch=null", "model=tiny"]
    kill = [
        "+callbacks.kill._target_=tests.training.callbacks.KillAtStep",
        "+callbacks.kill.step=6",
    ]
    interval = ["callbacks.last_checkpoint.every_minutes=1e-6"]
    result = cli([*cli_overrides(tmp_path), *steps, *kill, *interval], tmp_path)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    (run,) = run_dirs(tmp_path)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6


def test_keep_last_keeps_the_newest_step_checkpoints(tmp_path):
    from aiayn.training.run import run
    from tests.helpers import compose_train

    overrides = ["model=tiny", "trainer.max_steps=6", "trainer.max_epochs=-1", "test=false"]
    overrides += ["trainer.val_check_interval=6", "trainer.check_val_every_n_epoch=null"]
    overrides += ["callbacks.last_checkpoint.every_n_train_steps=1"]
    overrides += ["callbacks.last_checkpoint.keep_last=3", "~callbacks.rich_progress_bar"]
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "step-best.ckpt").write_bytes(b"not ours")  # left alone
    run(compose_train(overrides, output_dir=tmp_path))
    kept = sorted(p.name for p in directory.glob("step*.ckpt"))
    assert kept == ["step-best.ckpt", "step4.ckpt", "step5.ckpt", "step6.ckpt"]
    for step in (4, 5, 6):
        assert torch.load(directory / f"step{step}.ckpt", weights_only=True)["global_step"] == step


@pytest.mark.parametrize("due", ["clock", "validation"])
def test_last_checkpoint_is_written_only_where_an_update_ends(due, tmp_path):
    """With 3 micro-batches an update, neither the time interval falling due after an
    update's second micro-batch nor a validation after it (every 4 batches) writes last.ckpt
    there (a resume would lose those micro-batches' gradients): each write holds whole
    updates, 3 batches each, and the one due is written at its update's end."""
    from aiayn.training.run import run
    from tests.helpers import compose_train

    overrides = ["model=tiny", "trainer.max_steps=3", "trainer.max_epochs=-1", "test=false"]
    overrides += ["trainer.accumulate_grad_batches=3", "~callbacks.rich_progress_bar"]
    overrides += ["trainer.check_val_every_n_epoch=null", "callbacks.last_checkpoint.keep_last=9"]
    if due == "clock":
        overrides += ["trainer.val_check_interval=9", "callbacks.last_checkpoint.every_minutes=60"]
        overrides += ["+callbacks.due._target_=tests.training.callbacks.ClockDueAtBatch"]
        overrides += ["+callbacks.due.batch_idx=4"]
    else:
        overrides += ["trainer.val_check_interval=4", "callbacks.last_checkpoint.every_minutes=0"]
    run(compose_train(overrides, output_dir=tmp_path))
    written = {}
    for path in (tmp_path / "checkpoints").glob("step*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]
        written[checkpoint["global_step"]] = progress["processed"]
    assert written == {2: 6, 3: 9}  # the one due (update 2), and the end of training


def test_metrics_json_records_the_kernel_settings_the_environment_overrides(tmp_path, monkeypatch):
    """aiayn's kernel switches and the oneDNN / ideep cache capacities (docs/recipes.md) that
    the environment sets are in metrics.json's `kernel_overrides`; other variables are not."""
    from aiayn.training.run import run
    from tests.helpers import compose_train

    settings = {"AIAYN_KEEP_FREED_MEMORY": "0", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128"}
    settings["LRU_CACHE_CAPACITY"] = "64"
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    for name in ("AIAYN_ONEDNN", "AIAYN_PACK_WEIGHTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DNNL_VERBOSE", "0")  # oneDNN's, but no kernel setting
    overrides = ["model=tiny", "trainer.max_steps=1", "trainer.max_epochs=-1", "test=false"]
    run(compose_train([*overrides, "~callbacks.rich_progress_bar"], output_dir=tmp_path))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["kernel_overrides"] == settings


@pytest.mark.slow
@pytest.mark.parametrize("preset", VARIANT_PRESETS)
def test_every_variant_preset_trains_on_the_toy_corpus(preset, tmp_path):
    """`python train.py model=<preset>` at a small width: 60 updates lower the loss by > 1."""
    from aiayn.training.run import run

    small = ["model.d_model=64", "model.num_heads=4", "model.d_ff=128"]
    small += ["model.num_encoder_layers=2", "model.num_decoder_layers=2", "test=false"]
    if preset == "seed002":
        small.append("model.d_embed=32")
    fast = [o for o in fast_overrides(tmp_path) if not o.startswith("model=")]
    overrides = [*fast, f"model={preset}", *small, *SIXTY_STEPS]
    run(compose_train([*overrides, "data.max_tokens=512"], output_dir=tmp_path))
    losses = csv_metrics(tmp_path)["train/loss"]
    assert_loss_fell(losses, by=1.0)


@pytest.fixture(scope="module")
def multi30k_cache(tmp_path_factory):
    """One prepared Multi30k cache (a 2k joint BPE) for every preset below."""
    return tmp_path_factory.mktemp("multi30k_cache")


@pytest.mark.slow
@pytest.mark.parametrize("preset", VARIANT_PRESETS)
def test_every_variant_preset_trains_on_multi30k(preset, tmp_path, multi30k_root, multi30k_cache):
    """`python train.py data=multi30k model=<preset>` at a small width: the real corpus and
    tokenizer, 60 updates lower the loss by > 0.5, and a validation decodes."""
    from aiayn.training.run import run

    small = ["model.d_model=64", "model.num_heads=4", "model.d_ff=128"]
    small += ["model.num_encoder_layers=2", "model.num_decoder_layers=2", "test=false"]
    if preset == "seed002":
        small.append("model.d_embed=32")
    data = ["data=multi30k", f"data.root={multi30k_root}", f"data.cache_dir={multi30k_cache}"]
    data += ["data.tokenizer.vocab_size=2000", "data.max_tokens=1024"]
    fast = [o for o in fast_overrides(tmp_path) if not o.startswith(("model=", "data."))]
    overrides = [*fast, *data, f"model={preset}", *small, *SIXTY_STEPS]
    overrides += ["trainer.limit_val_batches=2", "+val_decode.max_len_b=5"]
    metrics = run(compose_train(overrides, output_dir=tmp_path))
    losses = csv_metrics(tmp_path)["train/loss"]  # from ~ln(2000) = 7.6
    assert_loss_fell(losses, by=0.5)
    assert metrics["fit"]["val/loss"] < losses[0]
