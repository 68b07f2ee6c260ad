"""Print the machine a benchmark or a recorded run ran on: CPU model, SIMD flags, threads,
and the measured fp32 (and bf16, where the CPU has native support) matrix-multiply peak.

    python benchmarks/machine.py [--size 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [f for f in FLAGS if f in present]
    except OSError:
        pass
    return []


def gemm_gflops(dtype: torch.dtype, size: int, repeats: int) -> float:
    """Best-of-`repeats` GFLOP/s of a (size x size) @ (size x size) product."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def describe(size: int = 2048, repeats: int = 5) -> dict[str, object]:
    info: dict[str, object] = {
        "cpu": cpu_model(),
        "flags": " ".join(cpu_flags()),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fp32_gflops": round(gemm_gflops(torch.float32, size, repeats), 1),
    }
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        info["bf16_gflops"] = round(gemm_gflops(torch.bfloat16, size, repeats), 1)
    else:
        info["bf16_gflops"] = "not native (bf16 matmul runs emulated, far slower)"
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for key, value in describe(args.size, args.repeats).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
