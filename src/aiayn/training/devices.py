"""Where a run trains and what that decides before any work: the precision `auto` resolves to,
the kernel policy, the settings a GPU run gets (TF32), and the pairs of machine, model and
precision that cannot run, refused by key.

| trainer.precision: auto | resolves to                                             |
|-------------------------|---------------------------------------------------------|
| CUDA, compute >= 8.0    | bf16-mixed (native bfloat16: A100, H100, RTX 30xx on)   |
| older CUDA GPUs         | 16-mixed (float16 with a GradScaler: V100, T4, ...)     |
| CPU                     | 32-true (bf16-mixed only pays with AMX / AVX-512 BF16)  |
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from aiayn.errors import ConfigError
from aiayn.kernels.machine import bf16_native, matmul_flops

log = logging.getLogger(__name__)


def on_cpu(trainer: dict[str, Any]) -> bool:
    """Whether `trainer` (the trainer config) trains on the CPU."""
    accelerator = str(trainer.get("accelerator", "auto"))
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def on_cuda(trainer: dict[str, Any]) -> bool:
    """Whether `trainer` trains on CUDA GPUs."""
    accelerator = str(trainer.get("accelerator", "auto"))
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def resolve_precision(precision: Any, trainer: dict[str, Any]) -> str:
    """`trainer.precision` with `auto` made concrete for this machine (table above); an
    explicit value is returned as given."""
    if str(precision) != "auto":
        return str(precision)
    if on_cuda(trainer):
        return "bf16-mixed" if bf16_native("cuda") else "16-mixed"
    return "32-true"


def check(trainer: dict[str, Any], arch: str) -> None:
    """Refuse what the machine cannot run, naming the key: float16 on a CPU (Lightning would
    silently run bfloat16), more CPU processes than cores, and the LSTM baseline under
    bf16-mixed on a CPU without native bfloat16 (oneDNN has no such LSTM there); warn before
    any work of bf16 emulated on a CPU."""
    if not on_cpu(trainer):
        return
    precision = str(trainer.get("precision", "32-true"))
    if precision.startswith("16"):
        raise ConfigError(
            f"trainer.precision={precision} needs a GPU (on CPU Lightning would run bfloat16 "
            "instead); use trainer.precision=32-true, or bf16-mixed on a CPU with AMX"
        )
    devices, cores = trainer.get("devices", 1), os.cpu_count() or 1
    if isinstance(devices, int) and devices > cores:
        raise ConfigError(
            f"trainer.devices={devices} CPU processes but this machine has {cores} cores: "
            f"each process would wait on the others; use trainer.devices<={cores}"
        )
    if "bf16" not in precision or bf16_native("cpu"):
        return
    if arch == "rnn" and precision == "bf16-mixed":
        raise ConfigError(
            f"trainer.precision={precision} with model.arch=rnn needs a CPU with native "
            "bfloat16 (AVX-512 BF16 or AMX): oneDNN has no bfloat16 LSTM on this one; use "
            "trainer.precision=32-true (or bf16-true)"
        )
    slowdown = matmul_flops(torch.float32, 192, 3) / matmul_flops(torch.bfloat16, 192, 3)
    log.warning(
        "trainer.precision=%s on a CPU without native bfloat16 (no AVX-512 BF16 / AMX): "
        "matrix products measured %.0fx slower than float32 here, and a training step about "
        "an order of magnitude slower; use trainer.precision=32-true on this machine",
        precision,
        slowdown,
    )


def check_accelerator(trainer: dict[str, Any], cpu_recipe: str | None = None) -> None:
    """Refuse before any work a GPU accelerator on a machine where torch sees no GPU (CUDA;
    for `gpu`, Apple's MPS too; Lightning would stop later, in its own trace), naming
    `cpu_recipe` where the recipe has one; warn in one line when a recipe sized for a GPU is
    run on the CPU by choice."""
    accelerator = str(trainer.get("accelerator", "auto"))
    mps = accelerator == "gpu" and torch.backends.mps.is_available()
    if accelerator in ("gpu", "cuda") and not (torch.cuda.is_available() or mps):
        instead = "trainer=cpu to run it on this CPU"
        if cpu_recipe:
            instead = f"experiment={cpu_recipe}, the recipe sized for a CPU (or {instead})"
        raise ConfigError(
            f"trainer.accelerator={accelerator}, but torch {torch.__version__} sees no GPU on "
            f"this machine: use {instead}"
        )
    if cpu_recipe and on_cpu(trainer):
        log.warning(
            "this recipe is sized for a GPU (minutes there, hours on a CPU): on a CPU, "
            "experiment=%s is the recipe sized for it",
            cpu_recipe,
        )


# trainer.strategy values that train, resume, average, evaluate and export end to end; the
# sharded one is trainer=fsdp (Lightning's ModelParallelStrategy: FSDP2, whole checkpoints)
STRATEGIES = ("auto", "ddp", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true")
STRATEGY_CLASSES = ("DDPStrategy", "ModelParallelStrategy")


def check_strategy(trainer: dict[str, Any]) -> None:
    """Refuse by key, before any work, a `trainer.strategy` that some part of a run cannot
    follow: Lightning's FSDP1 (`fsdp`: no per-layer sharding, shard-shaped averages), DeepSpeed,
    spawn and notebook launchers, and sharded (distributed) checkpoints, which resume,
    `keep_last`, averaging, evaluate and export cannot read."""
    strategy = trainer.get("strategy", "auto")
    supported = f"{', '.join(STRATEGIES)}, or trainer=fsdp for sharded training"
    if isinstance(strategy, str):
        if strategy in STRATEGIES:
            return
        use = "trainer=fsdp" if "fsdp" in strategy else "trainer.strategy=ddp"
        raise ConfigError(
            f"trainer.strategy={strategy} is not supported from training to export here: use "
            f"{use} (supported: {supported})"
        )
    target = str(strategy.get("_target_", ""))
    if target.rsplit(".", 1)[-1] not in STRATEGY_CLASSES:
        raise ConfigError(
            f"trainer.strategy._target_={target} is not supported from training to export "
            f"here (supported: {supported})"
        )
    if target.endswith("ModelParallelStrategy") and strategy.get(
        "save_distributed_checkpoint",
        True,  # Lightning's default
    ):
        raise ConfigError(
            "trainer.strategy.save_distributed_checkpoint=true writes sharded checkpoints, "
            "which resume, callbacks.last_checkpoint.keep_last, averaging, evaluate.py and "
            "export cannot read: set it to false (trainer=fsdp's default)"
        )


def use_gpu_settings() -> None:
    """What a CUDA run sets: float32 products on TF32 tensor cores (cuBLAS and cuDNN)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
