"""The Throughput callback's mean rates: source + target tokens per second of training time,
and target tokens only (what fairseq and OpenNMT log), validation time excluded."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiayn.callbacks import throughput as module
from aiayn.callbacks.throughput import Throughput


def test_mean_rates_count_training_time_only_and_split_target_tokens(monkeypatch):
    clock = iter([10.0, 12.0, 14.0, 100.0, 101.0])  # 86 s of validation between batches 2, 3
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(module, "log_step", lambda trainer: True)  # every step a log step
    logged: dict[str, list[float]] = {}
    pl_module = SimpleNamespace(
        device=torch.device("cpu"),
        log=lambda name, value, **_: logged.setdefault(name, []).append(float(value)),
    )
    callback = Throughput()  # peak stays None: no MFU, which needs a model config
    assert callback.mean_rate(1) is None
    batches = [
        SimpleNamespace(num_src_tokens=300, num_tgt_tokens=100),
        SimpleNamespace(num_src_tokens=500, num_tgt_tokens=300),
        SimpleNamespace(num_src_tokens=60, num_tgt_tokens=40),
    ]
    one = SimpleNamespace(world_size=1)
    callback.on_train_batch_start(one)  # 10.0
    callback.on_train_batch_end(one, pl_module, None, batches[0])  # 12.0: 400 tokens in 2 s
    callback.on_train_batch_end(one, pl_module, None, batches[1])  # 14.0: 800 in 2 s
    callback.on_validation_start(one, pl_module)
    callback.on_train_batch_start(one)  # 100.0: the clock restarts after validation
    callback.on_train_batch_end(one, pl_module, None, batches[2])  # 101.0: 100 in 1 s
    assert logged["train/tokens_per_sec"] == [200.0, 400.0, 100.0]
    assert callback.mean_rate(1) == pytest.approx(1300 / 5)
    assert callback.mean_rate(1, target_only=True) == pytest.approx(440 / 5)
    assert callback.mean_rate(4, target_only=True) == pytest.approx(4 * 440 / 5)  # all ranks


def test_steps_between_log_steps_log_nothing_and_still_count(monkeypatch):
    """Lightning writes the values of log steps only; a step between them logs nothing (each
    log call costs host time that a GPU update waits for), and its tokens and seconds still
    count in the run's mean rates and minutes, and in the next log step's rate: that of the
    steps since the previous log step (on a GPU the log step, which waits for the device,
    takes the time of the steps the host issued before it, here 3 s against 1)."""
    clock = iter([10.0, 11.0, 14.0])
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    steps = iter([False, True, True])
    monkeypatch.setattr(module, "log_step", lambda trainer: next(steps))
    logged: dict[str, list[float]] = {}
    pl_module = SimpleNamespace(
        device=torch.device("cpu"),
        log=lambda name, value, **_: logged.setdefault(name, []).append(float(value)),
    )
    callback, one = Throughput(), SimpleNamespace(world_size=1)
    callback._start = 10.0  # as on_fit_start sets it (no peak: no MFU, which needs a model)
    callback.on_train_batch_start(one)  # 10.0
    batch = SimpleNamespace(num_src_tokens=30, num_tgt_tokens=10)
    callback.on_train_batch_end(one, pl_module, None, batch)  # 11.0: not a log step
    assert logged == {}
    callback.on_train_batch_end(one, pl_module, None, batch)  # 14.0: a log step
    assert logged["train/tokens_per_sec"] == [80 / 4]  # both steps' tokens over their 4 s
    assert logged["train/elapsed_min"] == [pytest.approx(4 / 60)]
    assert callback.mean_rate(1, target_only=True) == pytest.approx(20 / 4)
    clock = iter([15.0])  # the next log step's rate is its own interval's: 40 tokens in 1 s
    callback.on_train_batch_end(one, pl_module, None, batch)
    assert logged["train/tokens_per_sec"] == [20.0, 40.0]


def _peak_kib_from_proc() -> int:
    """VmHWM of /proc/self/status: the kernel's peak resident set of this process, KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


@pytest.mark.skipif(not module.sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_peak_resident_memory_is_logged_as_the_kernel_counts_it(monkeypatch):
    """`train/peak_rss_mib` is the process's high-water mark at the step, in MiB: between the
    kernel's VmHWM before and after it (within the few MiB its per-thread counters lag), and
    it grows when the process takes more memory."""
    logged: dict[str, list[float]] = {}
    pl_module = SimpleNamespace(
        device=torch.device("cpu"),
        log=lambda name, value, **_: logged.setdefault(name, []).append(float(value)),
    )
    batch = SimpleNamespace(num_src_tokens=10, num_tgt_tokens=10)
    callback = Throughput()
    monkeypatch.setattr(module, "log_step", lambda trainer: True)
    before = _peak_kib_from_proc()
    one = SimpleNamespace(world_size=1)
    callback.on_train_batch_end(one, pl_module, None, batch)
    grown = torch.ones((before + 64 * 1024) * 256)  # resident: 64 MiB more than the old peak
    callback.on_train_batch_end(one, pl_module, None, batch)
    after = _peak_kib_from_proc()
    first, second = logged["train/peak_rss_mib"]
    lag = 4  # MiB: getrusage and /proc read counters that the kernel syncs now and then
    assert before / 1024 - lag <= first < before / 1024 + 32 <= second <= after / 1024 + lag
    assert second >= grown.numel() * 4 / 2**20  # the new peak is seen


def test_metrics_json_records_the_peak_that_mfu_divides_by(monkeypatch, tmp_path):
    """On the CPU (no datasheet) the peak measured at fit start is the denominator of every
    `train/mfu` value; metrics.json names it as measured and gives it in both fields (here a
    stand-in for the measurement), and each logged MFU is the step's model FLOP/s over it."""
    from aiayn.kernels import machine
    from aiayn.training.run import run
    from tests.helpers import compose_train, csv_metrics

    measured = []
    monkeypatch.setattr(machine, "matmul_flops", lambda *a: measured.append(a) or 250e9)
    overrides = ["model=tiny", "trainer.max_steps=3", "trainer.max_epochs=-1", "test=false"]
    overrides += ["trainer.val_check_interval=3", "trainer.check_val_every_n_epoch=null"]
    overrides += ["~callbacks.rich_progress_bar", "trainer.log_every_n_steps=1"]
    metrics = run(compose_train(overrides, output_dir=tmp_path))
    assert len(measured) == 1 and measured[0][0] == torch.float32  # once, in fp32
    assert metrics["matmul_peak_gflops"] == 250.0
    assert metrics["mfu_peak_tflops"] == 0.25 and metrics["mfu_peak_source"] == "measured"
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["mfu_peak_source"] == "measured" and written["mfu_peak_tflops"] == 0.25
    mfu = csv_metrics(tmp_path)["train/mfu"]
    assert len(mfu) == 3 and all(0 < m < float("inf") for m in mfu)
    # the count behind the target rate (the peer table's one clock): 3 batches' real tokens
    tokens = written["train_target_tokens"]
    assert isinstance(tokens, int) and 3 * 10 < tokens <= 3 * 4096
    assert 0 < tokens / written["train_target_tokens_per_sec"] < 60  # seconds of training


def test_mfu_divides_by_the_datasheet_peak_of_a_listed_gpu(monkeypatch):
    """A listed card's MFU peak is its datasheet's for the precision in use (the measured one
    beside it, named as such); an unlisted card and the CPU fall back to the measured peak."""
    from aiayn.kernels import machine

    monkeypatch.setattr(machine, "matmul_flops", lambda *a: 700e12)
    names = iter(["NVIDIA H100 80GB HBM3", "NVIDIA H200", "Tesla V100-SXM2-16GB", "Some GPU"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: next(names))
    h100 = machine.mfu_peak(torch.bfloat16, torch.device("cuda"))
    assert (h100.flops, h100.source, h100.measured) == (989e12, "datasheet", 700e12)
    h200 = machine.mfu_peak(torch.float32, torch.device("cuda"), measure=False)
    assert (h200.flops, h200.source, h200.measured) == (494e12, "datasheet", None)
    v100 = machine.mfu_peak(torch.float16, torch.device("cuda"))
    assert v100.flops == 125e12
    unlisted = machine.mfu_peak(torch.bfloat16, torch.device("cuda"))
    assert (unlisted.flops, unlisted.source) == (700e12, "measured")
    assert machine.mfu_peak(torch.float32, "cpu", measure=False) is None
    assert machine.datasheet_peak("Tesla V100-PCIE-32GB", torch.bfloat16) is None
