"""What the machine is and what it can do: CPU model and SIMD flags, and the measured
matrix-multiply peak that benchmarks and the training MFU (`train/mfu`) are measured against.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable

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
