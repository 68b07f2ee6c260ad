"""What the machine is and what it can do: CPU model and SIMD flags, the measured
matrix-multiply peak, and `mfu_peak`, the one peak that every model-FLOP utilisation
(`train/mfu`, `metrics.json`, `benchmarks/`) divides by.

MFU, defined once: the model's FLOPs (3 x `aiayn.model.summary.forward_flops` of the padded
batch: forward and backward, matrix products only) per second, over `mfu_peak`: a GPU's
datasheet dense tensor-core peak for the precision in use (`DATASHEET_TFLOPS`). CPUs publish no
such figure, and an unlisted card has none here: there the peak measured on the device in that
precision (`matmul_flops`) stands in, and the run records which (`MfuPeak.source`).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")


def _cpuinfo(field: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown"


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... (empty where /proc/cpuinfo does not say)."""
    return _cpuinfo("vendor_id") or ""


def cpu_flags(wanted: Iterable[str] = FLAGS) -> list[str]:
    """The flags of ``wanted`` (default `FLAGS`: what decides fp32/bf16 matmul speed) this CPU
    has."""
    present = set((_cpuinfo("flags") or "").split())
    return [f for f in wanted if f in present]


def onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x (M, K) @ weight (N, K).T + bias (N,)`` -> ``(M, N)`` on oneDNN (strided views
    allowed): the product `aiayn.kernels.linear` sends float32 CPU products to."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def bf16_native(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively (AVX-512 BF16 / AMX, or a bf16 GPU)."""
    if torch.device(device).type == "cuda":  # Ampere (8.0) on; is_bf16_supported counts emulation
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def matmul_flops(
    dtype: torch.dtype = torch.float32,
    size: int = 2048,
    repeats: int = 5,
    device: torch.device | str = "cpu",
) -> float:
    """FLOP/s of the fastest of `repeats` (size x size) @ (size x size) products after a
    warm-up, on `device` in `dtype`: the faster of torch's `@` and, for float32 on the CPU,
    the oneDNN product that aiayn's linear layers can use (`aiayn.kernels.linear`, whether or
    not they use it on this CPU), so that a model-FLOP utilisation is against the best this
    machine does."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    best = float("inf")
    products = [lambda: a @ b]
    if dtype == torch.float32 and torch.device(device).type == "cpu":
        products.append(lambda: onednn_product(a, b.t()))
    for product in products:
        product()  # warm-up
        sync()
        for _ in range(repeats):
            start = time.perf_counter()
            product()
            sync()
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def describe(size: int = 2048, repeats: int = 5) -> dict[str, object]:
    """CPU, flags, threads, torch, and the measured fp32 (and native bf16) GFLOP/s."""
    info: dict[str, object] = {
        "cpu": cpu_model(),
        "flags": " ".join(cpu_flags()),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fp32_gflops": round(matmul_flops(torch.float32, size, repeats) / 1e9, 1),
    }
    if bf16_native():
        info["bf16_gflops"] = round(matmul_flops(torch.bfloat16, size, repeats) / 1e9, 1)
    else:
        info["bf16_gflops"] = "not native (bf16 matmul runs emulated, far slower)"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_bf16_tflops"] = round(
            matmul_flops(torch.bfloat16, 8192, repeats, "cuda") / 1e12, 1
        )
    return info


# dense tensor-core peaks (TFLOP/s) from the vendors' datasheets: (bf16, fp16, tf32), by the
# start of the name torch.cuda.get_device_name() gives (the sparse figures are twice these)
DATASHEET_TFLOPS: dict[str, tuple[float | None, float, float]] = {
    "NVIDIA H200": (989.0, 989.0, 494.0),
    "NVIDIA H100 80GB HBM3": (989.0, 989.0, 494.0),  # SXM
    "NVIDIA H100 PCIe": (756.0, 756.0, 378.0),
    "NVIDIA H100 NVL": (835.0, 835.0, 418.0),
    "NVIDIA A100": (312.0, 312.0, 156.0),
    "NVIDIA A10": (125.0, 125.0, 62.5),
    "NVIDIA L4": (121.0, 121.0, 60.0),
    "NVIDIA L40S": (362.0, 362.0, 183.0),
    "NVIDIA GeForce RTX 4090": (165.0, 165.0, 82.6),
    "NVIDIA GeForce RTX 3090": (71.0, 71.0, 35.6),
    "Tesla V100": (None, 125.0, 15.7),  # no bf16; float32 without TF32
    "Tesla T4": (None, 65.0, 8.1),
}


def datasheet_peak(name: str, dtype: torch.dtype) -> float | None:
    """FLOP/s of the card named `name` (``torch.cuda.get_device_name()``) in `dtype` by its
    datasheet (float32 counts TF32, which GPU runs enable), or None if not listed."""
    for prefix, peaks in DATASHEET_TFLOPS.items():
        if name.startswith(prefix):
            index = {torch.bfloat16: 0, torch.float16: 1}.get(dtype, 2)
            peak = peaks[index]
            return None if peak is None else peak * 1e12
    return None


@dataclass(frozen=True)
class MfuPeak:
    """The FLOP/s an MFU divides by, and where it comes from: ``datasheet`` or ``measured``."""

    flops: float
    source: str
    measured: float | None = None  # the measured peak, printed beside a datasheet one


def mfu_peak(
    dtype: torch.dtype, device: torch.device | str = "cpu", measure: bool = True
) -> MfuPeak | None:
    """The peak every MFU of a run in `dtype` on `device` divides by (see the module's
    docstring): the datasheet's for a listed GPU (with the measured one beside it when
    `measure`), else the measured one (None without `measure`)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    measured = None
    if measure:
        size = 8192 if cuda else 1024
        if not cuda and dtype != torch.float32 and not bf16_native("cpu"):
            size = 256  # emulated half precision is slow: a small product says as much
        measured = matmul_flops(dtype, size, 3, device)
    sheet = datasheet_peak(torch.cuda.get_device_name(device), dtype) if cuda else None
    if sheet is not None:
        return MfuPeak(sheet, "datasheet", measured)
    return None if measured is None else MfuPeak(measured, "measured", measured)
