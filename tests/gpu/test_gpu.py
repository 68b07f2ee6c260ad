"""The GPU layer: what only a CUDA machine can run, `python -m pytest -m gpu` (skipped where
torch sees no CUDA GPU). It trains through `train.py` as a user does: each precision with
gradient clipping, DDP on 2 GPUs, FSDP on the GPUs there are with checkpoint averaging, a
multirun of one-GPU jobs, 16-mixed with accumulation, a SIGKILL and a resume equal to an
uninterrupted run; decodes with beam search, `evaluate.py` and `translate.py` on the GPU
(float32 equal to the CPU, bf16/fp16 by `dtype=auto`), CTranslate2 on the GPU; and runs
`benchmarks/train_speed.py --device cuda` and `benchmarks/decode_speed.py --device cuda`. The
CPU emulation of what CUDA enforces (collectives on the device, no host-device syncs in a step,
float16 with a GradScaler) is `tests/training/test_gpu_contracts.py`."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch

from aiayn.errors import ConfigError
from aiayn.kernels.machine import bf16_native
from tests.helpers import (
    REPO,
    SIXTY_STEPS,
    assert_loss_fell,
    cli,
    cli_overrides,
    csv_metrics,
    run_dirs,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOY = ["data.toy.train_size=2000", "data.toy.val_size=50", "data.toy.test_size=50"]
LINES = ["the red dog sees the big cat.", "yesterday Anna saw two green birds."]


def _train(tmp_path, *extra: str):
    result = cli([*cli_overrides(tmp_path), *TOY, *SIXTY_STEPS, "trainer=gpu", *extra], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    return run, result


@pytest.mark.parametrize("precision", ["auto", "bf16-mixed", "16-mixed", "32-true"])
def test_each_precision_trains_with_clipping_and_decodes(precision, tmp_path):
    if precision == "bf16-mixed" and not bf16_native("cuda"):
        pytest.skip("bf16-mixed needs compute capability 8.0")
    run, _ = _train(tmp_path, f"trainer.precision={precision}", "trainer.gradient_clip_val=1.0")
    logged = csv_metrics(run)
    assert_loss_fell(logged["train/loss"], by=1.0)
    assert max(logged["train/grad_norm"]) < 1e3  # unscaled, also under 16-mixed's GradScaler
    metrics = json.loads((run / "metrics.json").read_text())
    auto = "bf16-mixed" if bf16_native("cuda") else "16-mixed"
    assert metrics["precision"] == (auto if precision == "auto" else precision)
    assert metrics["kernels"] == "gpu" and metrics["compile"] is False  # COMPILE_WINS
    assert 0.0 <= metrics["test"]["test/bleu"] <= 100.0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ddp_on_two_gpus_trains_over_nccl(tmp_path):
    run, result = _train(tmp_path, "trainer=ddp", "trainer.accelerator=gpu")
    assert "distributed_backend=nccl" in result.stdout + result.stderr
    assert_loss_fell(csv_metrics(run)["train/loss"], by=1.0)


def test_fsdp_on_the_gpus_there_are_trains_in_bf16_averages_and_its_checkpoints_load(tmp_path):
    """`trainer=fsdp` on every GPU of the machine (one is enough to exercise sharding, the
    bf16 mixed-precision policy and the whole-checkpoint gather), with the averaging callback
    and `test_ckpt=averaged`: the average has whole weights and loads on any device."""
    from aiayn.inference import load_checkpoint

    devices = torch.cuda.device_count()
    run, result = _train(
        tmp_path,
        "trainer=fsdp",
        "callbacks=[default,average]",
        "callbacks.average.last=2",
        "callbacks.average.every_n_steps=20",
        "test_ckpt=averaged",
        "trainer.accelerator=gpu",
        f"trainer.devices={devices}",
        "trainer.gradient_clip_val=1.0",
    )
    assert f"units sharded over {devices} processes" in result.stdout
    assert_loss_fell(csv_metrics(run)["train/loss"], by=1.0)
    last = run / "checkpoints" / "last.ckpt"  # whole weights: one device decodes as another
    on_gpu = load_checkpoint(last, "cuda").translate(LINES)
    assert on_gpu == load_checkpoint(last, "cpu").translate(LINES)
    averaged = run / "checkpoints" / "averaged.ckpt"
    saved = torch.load(averaged, weights_only=True)
    assert saved["averaged_from"] == ["step 40", "step 60"]
    whole = torch.load(last, weights_only=True)["state_dict"]
    assert {k: v.shape for k, v in saved["state_dict"].items()} == {
        k: v.shape for k, v in whole.items()
    }
    # the mean of steps 40 and 60, not step 60 alone (the gathered snapshots differ)
    assert any(not torch.equal(saved["state_dict"][k], v) for k, v in whole.items())
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test_checkpoint"] == str(averaged)
    assert 0 <= metrics["test"]["test/bleu"] <= 100
    assert len(load_checkpoint(averaged, "cpu").translate(LINES)) == len(LINES)


def test_a_multirun_of_one_gpu_jobs_runs_each_job_once(tmp_path):
    """`-m` with `trainer.devices=1` jobs on the basic launcher (one process, the jobs one
    after another on the GPU): every job its own directory and result, none run twice."""
    args = [*cli_overrides(tmp_path), *TOY, *SIXTY_STEPS, "trainer=gpu", "trainer.devices=1"]
    result = cli(["-m", *args, "seed=1,2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    seeds = [json.loads((job / "metrics.json").read_text()) for job in jobs]
    assert all(0.0 <= m["test"]["test/bleu"] <= 100.0 for m in seeds)
    assert not (tmp_path / "logs" / "train" / "runs").exists()  # no stray run directory


def test_fp16_with_accumulation_skips_no_early_update(tmp_path):
    """16-mixed with 2 micro-batches per update: the first updates are kept (the loss is
    summed at GradScaler's initial scale without overflowing; issue 49)."""
    run, _ = _train(tmp_path, "trainer.precision=16-mixed", "trainer.accumulate_grad_batches=2")
    logged = csv_metrics(run)
    assert logged["train/skipped_updates"][0] == 0  # by update 5
    assert max(logged["train/skipped_updates"]) <= 1
    assert_loss_fell(logged["train/loss"], by=1.0)


def test_sigkill_and_resume_equal_an_uninterrupted_run(tmp_path):
    common = [
        "trainer.deterministic=true",
        "trainer.val_check_interval=20",
        "trainer.check_val_every_n_epoch=null",
    ]
    straight, _ = _train(tmp_path / "straight", *common)
    killed_dir = tmp_path / "killed"
    args = [*cli_overrides(killed_dir), *TOY, *SIXTY_STEPS, "trainer=gpu", *common]
    kill = ["+callbacks.kill._target_=tests.training.callbacks.KillAtStep"]
    kill += ["+callbacks.kill.step=40"]
    assert cli([*args, *kill], killed_dir).returncode == -signal.SIGKILL
    (run,) = run_dirs(killed_dir)
    resumed = cli([*args, f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], killed_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_beam_search_evaluate_and_translate_on_the_gpu(tmp_path):
    from aiayn.inference import load_checkpoint

    run, _ = _train(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    for strategy in ("greedy", "beam"):
        on_gpu = load_checkpoint(last, "cuda", dtype="float32")
        on_cpu = load_checkpoint(last, "cpu")
        for translator in (on_gpu, on_cpu):
            translator.decode = translator.decode.updated({"strategy": strategy, "beam_size": 4})
        assert on_gpu.translate(LINES) == on_cpu.translate(LINES)
    half = load_checkpoint(last, "cuda", dtype="auto")
    assert next(half.model.parameters()).dtype in (torch.bfloat16, torch.float16)
    assert len(half.translate(LINES)) == 2
    args = [f"ckpt_path={last}", "device=cuda", "+decode.strategy=beam"]
    scored = cli(args, tmp_path, "evaluate.py")
    assert scored.returncode == 0, scored.stderr[-3000:]
    source = tmp_path / "src.txt"
    source.write_text("\n".join(LINES) + "\n")
    args = [f"ckpt_path={last}", "device=cuda", f"input={source}", f"output={tmp_path / 'out'}"]
    translated = cli(args, tmp_path, "translate.py")
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert len((tmp_path / "out").read_text().splitlines()) == 2


def test_ctranslate2_decodes_on_the_gpu_as_pytorch_does(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    if ctranslate2.get_cuda_device_count() == 0:
        pytest.skip("this CTranslate2 build has no CUDA")
    from aiayn.inference import load_checkpoint
    from aiayn.inference.ct2 import load_translator

    run, _ = _train(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    ct2 = load_translator(str(last), "cuda", engine="ctranslate2")
    try:
        theirs = ct2.translate(LINES)
    except ConfigError as error:  # a CUDA 12 wheel where only CUDA 13's libraries are
        if "cannot be loaded" not in str(error):
            raise
        pytest.skip(str(error))
    assert theirs == load_checkpoint(last, "cuda", dtype="float32").translate(LINES)


def _benchmark(script: str, *args: str):
    """`python benchmarks/<script> --device cuda <args>` from the repository root, with
    `src` ahead of what the environment's PYTHONPATH already holds; asserts it exited 0."""
    import subprocess

    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--device", "cuda", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_train_speed_on_cuda_prints_mfu_against_the_datasheet_beside_marian(tmp_path):
    pytest.importorskip("transformers")
    result = _benchmark("train_speed.py", "--repeats", "2", "--shapes", "tiny,small,base,big")
    assert "datasheet" in result.stdout and torch.cuda.get_device_name() in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    for shape in ("tiny", "small", "base", "big"):
        assert any(row.startswith(f"| {shape} ") for row in rows), result.stdout


def test_decode_speed_on_cuda_prints_aiayn_beside_hf_and_the_ratios_of_its_rates(tmp_path):
    pytest.importorskip("transformers")
    small = ["--d-model", "32", "--heads", "2", "--layers", "1", "--ffn", "64", "--vocab", "100"]
    small += ["--batch-size", "4", "--sentences", "6", "--src-len", "5", "--new-tokens", "6"]
    result = _benchmark("decode_speed.py", *small, "--repeats", "1")
    out = result.stdout
    assert torch.cuda.get_device_name() in out and torch.__version__ in out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()]
    for strategy in ("greedy", "beam 4"):
        # every sentence the same length: aiayn, aiayn without CUDA graphs, CT2 bf16, CT2 int8,
        # HF, aiayn/HF, CT2 int8/HF
        fixed, varied = [row for row in rows if row[0] == strategy]
        aiayn, hf = float(fixed[1]), float(fixed[5])
        assert float(fixed[2]) > 0
        assert float(fixed[6].removesuffix("x")) == pytest.approx(aiayn / hf, rel=0.01, abs=0.006)
        for name, cell in (("CT2 bf16", fixed[3]), ("CT2 int8", fixed[4])):
            assert (cell == "skipped" and f"{name}: skipped: " in out) or float(cell) > 0, out
        aiayn, hf = float(varied[1]), float(varied[2])
        assert float(varied[3].removesuffix("x")) == pytest.approx(aiayn / hf, rel=0.01, abs=0.006)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_blocked_cuda_loss_equals_cross_entropy_without_the_whole_logits(dtype):
    """kernels=gpu: the output layer fused into the loss a block at a time gives
    F.cross_entropy's loss and gradients within the half precision's tolerance (float16 under
    a GradScaler's 65 536), and its peak memory stays far below one float32 N x V array."""
    from aiayn import kernels
    from aiayn.model.embedding import OutputProjection
    from aiayn.training.loss import projected_label_smoothed_loss, torch_label_smoothed_loss

    torch.manual_seed(0)
    n, d, v = 8192, 512, 37000
    features = torch.randn(n, d, device="cuda", requires_grad=True)
    output = OutputProjection(d, v, None, False).cuda()
    torch.nn.init.normal_(output.weight, std=d**-0.5)
    target = torch.randint(4, v, (n,), device="cuda")
    target[-100:] = 0  # padding
    results = []
    for policy in ("gpu", "torch"):
        kernels.use(policy)
        features.grad, output.weight.grad = None, None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=dtype):
            if policy == "gpu":
                loss, nll = projected_label_smoothed_loss(features, output, target, 0.1)
            else:
                loss, nll = torch_label_smoothed_loss(output(features), target, 0.1)
        (loss * 65536.0).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        grads = (features.grad / 65536.0, output.weight.grad / 65536.0)
        results.append((loss.detach().float(), nll.float(), grads, peak))
    kernels.use("cpu")
    (loss, nll, grads, peak), (ref_loss, ref_nll, ref_grads, ref_peak) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-2, atol=1e-2)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(got).all()
        scale = want.abs().max()
        assert (got - want).abs().max() <= 2e-2 * scale
    assert peak < n * v * 4 / 2 < ref_peak  # under half of one float32 N x V array


@pytest.mark.filterwarnings("error:decoding without CUDA graphs")  # captured, or the test fails
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_decoding_gives_the_shrinking_batch_s_hypotheses(dtype):
    """decode.cuda_graphs (null: on, on a GPU): greedy and beam search on a static cache, the
    decoder step one CUDA graph, give the hypotheses of the shrinking batch without graphs
    (float32: every token; bfloat16, whose sums round by shape: nearly every sentence), with
    and without source padding, and a second batch of another shape captures its own graph."""
    from aiayn.model import DecodeConfig, ModelConfig, Transformer, generate

    torch.manual_seed(0)
    config = ModelConfig(
        src_vocab_size=50,
        tgt_vocab_size=50,
        d_model=64,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=128,
        dropout=0.0,
    )
    model = Transformer(config).cuda().to(dtype).eval()
    with torch.no_grad():
        model.output.weight.mul_(4.0)  # sharper distributions: outputs of varied lengths
    src = torch.randint(4, 50, (24, 11), device="cuda")
    for row in range(0, 24, 3):
        src[row, 3 + row % 7 :] = config.pad_id
    same = 0
    for decode in (DecodeConfig(max_len_b=12), DecodeConfig("beam", beam_size=4, nbest=2)):
        for batch in (src, src[:5, :7].clone().fill_(7)):
            graphs = generate(model, batch, decode)
            plain = generate(model, batch, decode.updated({"cuda_graphs": False}))
            tokens = [[[h.tokens for h in hyps] for hyps in out] for out in (graphs, plain)]
            if dtype == torch.float32:
                assert tokens[0] == tokens[1]
                for ours, theirs in zip(graphs, plain, strict=True):
                    got, want = [h.score for h in ours], [h.score for h in theirs]
                    assert got == pytest.approx(want, rel=1e-4)
            same += sum(a == b for a, b in zip(*tokens, strict=True))
    assert same >= 0.9 * 2 * (24 + 5)


def test_a_training_step_off_the_log_steps_never_waits_for_the_gpu(tmp_path):
    """A real compiled bf16 run on the GPU with CUDA's sync debug mode set to error inside
    the steps that are not log steps: no step reads the device or blocks on a copy."""
    run, _ = _train(
        tmp_path,
        "trainer.log_every_n_steps=20",
        "+callbacks.no_sync._target_=tests.gpu.cuda_rules.NoCudaSync",
        "+callbacks.no_sync.every=20",
    )
    assert json.loads((run / "metrics.json").read_text())["updates"] == 60
