"""The CPU cost of one update of each run-7 shape against the recipe's, which sets the equal-time
step counts of run 7 (multi30k_cpu_levers_h200.md). From the repo root, alone on the machine:

    python experiments/multi30k_cpu_levers_h200/update_cost.py

One update as benchmarks/train_speed.py times it (aiayn's loss, backward and Adam step), batch
80 x 25 + 25 tokens, vocabulary 8 000, 2 threads; best of 5 rounds of 4 updates, the shapes
interleaved within a round."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from train_speed import aiayn_step, random_batch

from aiayn.kernels.allocator import keep_freed_memory
from aiayn.kernels.machine import cpu_flags, cpu_model, matmul_flops

SHAPES = {  # d_model, layers (each side), heads, d_ff
    "recipe 3+3 d256": (256, 3, 4, 1024),
    "2+2 d256": (256, 2, 4, 1024),
    "2+2 d384 h6 ff1536": (384, 2, 6, 1536),
}
RECIPE_UPDATES = 3930  # the AVX2 hour's updates (experiments/peers/aiayn_same)


def main() -> None:
    torch.set_num_threads(2)
    keep_freed_memory()
    args = argparse.Namespace(batch_size=80, src_len=25, tgt_len=25, vocab=8000)
    batch = random_batch(args, torch.device("cpu"))
    steps = {name: aiayn_step(shape, args.vocab, batch) for name, shape in SHAPES.items()}
    for step in steps.values():
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {name: [] for name in SHAPES}
    for _ in range(5):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(4):
                step()
            times[name].append((time.perf_counter() - start) / 4)
    flags = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx"))))
    print(f"{cpu_model()} ({flags}), fp32 peak {matmul_flops(torch.float32) / 1e9:.1f} GFLOP/s")
    base = min(times["recipe 3+3 d256"])
    for name, spent in times.items():
        ratio = min(spent) / base
        print(
            f"{name}\t{min(spent) * 1000:.0f} ms/update\tratio {ratio:.3f}\t"
            f"updates at equal time {RECIPE_UPDATES / ratio:.0f}"
        )


if __name__ == "__main__":
    main()
