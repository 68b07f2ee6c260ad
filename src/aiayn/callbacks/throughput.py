"""`Throughput`: `train/tokens_per_sec`, real (non-padding) source + target tokens per second
of training time, summed over ranks (validation time does not count); `train/mfu`, the model
FLOP utilisation as `aiayn.kernels.machine` defines it for every MFU of the project: the steps'
matrix-product FLOPs (3 x `forward_flops` of each padded batch) per second over the GPU's
datasheet dense peak in the training precision (`mfu_peak`; on a CPU or an unlisted card, the
peak measured on the device at the start of fitting, which `metrics.json` names as such); and
`train/elapsed_min`, wall-clock minutes of fitting (validation
included; a resumed run continues from its checkpoint's minutes), the x axis of the curves in
`experiments/`; and `train/peak_rss_mib`, the highest resident memory of this process so far
(host memory, MiB: the figure `/usr/bin/time` reports at the end), whose curve shows when a
run's memory grows."""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
import torch

from aiayn.kernels.machine import MfuPeak, mfu_peak
from aiayn.model.summary import forward_flops
from aiayn.training.loggers import log_host, log_step

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None  # type: ignore[assignment]

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}


def precision_dtype(precision: object) -> torch.dtype:
    """The dtype matrix products run in under Lightning's `trainer.precision`."""
    text = str(precision)
    for prefix, dtype in PRECISION_DTYPES.items():
        if text.startswith(prefix):
            return dtype
    return torch.float32


def peak_rss_mib() -> float | None:
    """This process's peak resident set size so far in MiB (None where the OS does not say)."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class Throughput(L.Callback):
    """Logs its metrics at log steps (`aiayn.training.loggers.log_step`: the steps whose values
    Lightning writes) and keeps this process's totals (`tokens`, `target_tokens`, `seconds`)
    for the run's mean rates. `train/tokens_per_sec` and `train/mfu` are the rates of the
    steps since the previous log step (tokens and FLOPs over their training time, as fairseq's
    `wps` is over its log interval), not of the log step alone: on a GPU the host issues the
    steps between log steps ahead of the device, and the log step, which reads the device,
    waits for all of them, so its own time holds theirs. Added to every run by
    `aiayn.training.run`."""

    def __init__(self) -> None:
        self.tokens, self.target_tokens, self.seconds = 0, 0, 0.0
        self._last: float | None = None
        self._start: float | None = None
        self.peak: MfuPeak | None = None  # what train/mfu divides by (set at fit start)
        self._before = 0.0  # minutes of fitting in the attempts before this one (resume)
        self._minutes = 0.0  # the last train/elapsed_min logged
        # since the previous log step: tokens, matrix-product FLOPs and seconds of training
        self._tokens_since, self._flops_since, self._seconds_since = 0, 0, 0.0

    def mean_rate(self, world_size: int, target_only: bool = False) -> float | None:
        """Mean tokens per second of the run, all ranks (this rank's rate x ranks): source +
        target tokens, or target tokens only (the rate fairseq's `wps` and OpenNMT's
        `tok/s` report)."""
        tokens = self.target_tokens if target_only else self.tokens
        return tokens / self.seconds * world_size if self.seconds > 0 else None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.peak = mfu_peak(precision_dtype(trainer.precision), pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._last is None:
            self._last = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        now = time.perf_counter()
        elapsed = max(now - (self._last or now), 1e-9)
        self._last = now
        tokens = batch.num_src_tokens + batch.num_tgt_tokens
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + elapsed
        self.target_tokens += batch.num_tgt_tokens
        self._minutes = self._before + (now - (self._start or now)) / 60.0
        self._tokens_since += tokens
        self._seconds_since += elapsed
        if self.peak is not None:
            shape = (*batch.src.shape, batch.tgt_in.size(1))
            self._flops_since += 3 * forward_flops(pl_module.model_config, *shape)
        if not log_step(trainer):
            return  # Lightning writes the log steps' values only, and each log call costs the
            # host time that a GPU's update, issued by the host, waits for
        seconds, self._seconds_since = self._seconds_since, 0.0
        tokens, self._tokens_since = self._tokens_since, 0
        flops, self._flops_since = self._flops_since, 0
        # summed over ranks, so on the module's device (NCCL has no CPU tensors), made there by
        # a fill: a copy of host data would wait for the device
        rate = torch.full((), tokens / seconds, device=pl_module.device)
        pl_module.log("train/tokens_per_sec", rate, batch_size=1, sync_dist=True, reduce_fx="sum")
        if self.peak is not None:
            log_host(pl_module, "train/mfu", flops / seconds / self.peak.flops)
        log_host(pl_module, "train/elapsed_min", self._minutes, reduce_fx="max")
        rss = peak_rss_mib()
        if rss is not None:
            log_host(pl_module, "train/peak_rss_mib", rss, reduce_fx="max")

    def state_dict(self) -> dict[str, float]:
        return {"elapsed_min": self._minutes}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        """A resumed run's minutes continue from the checkpoint's."""
        self._before = self._minutes = float(state_dict.get("elapsed_min", 0.0))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = None  # validation time is not training throughput
