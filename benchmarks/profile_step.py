"""Where a training update's time goes: aiayn's real update (the LightningModule's loss, backward,
its optimizer's step) at one of `train_speed.py`'s shapes, with malloc keeping freed memory as
in train.py (`aiayn.kernels.allocator`). Prints the wall-clock time of each phase (the best of
each over `--steps` unprofiled updates) and their sum, then `torch.profiler`'s operators by
total CPU time over as many more. Since 9a37359 the output layer's gradient products run in the
forward pass (`projected_label_smoothed_loss`), so "forward and loss" holds them and "backward"
does not.

    python benchmarks/profile_step.py [--shape small] [--steps 5] [--rows 25] [--dropout 0.1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.kernels.allocator import keep_freed_memory

sys.path.insert(0, str(Path(__file__).parent))
from train_speed import DROPOUT, SHAPES, aiayn_step, random_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--src-len", type=int, default=24)
    parser.add_argument("--tgt-len", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--dropout", type=float, default=DROPOUT)
    args = parser.parse_args()
    keep_freed_memory()  # as train.py does (aiayn.kernels.allocator)
    batch = random_batch(args, torch.device("cpu"))
    phases: dict[str, list[float]] = {}
    step = aiayn_step(SHAPES[args.shape], args.vocab, batch, phases=phases, dropout=args.dropout)
    for _ in range(3):  # warm-up; the kept heap settles within a few updates
        step()
    phases.clear()
    for _ in range(args.steps):  # unprofiled: the profiler inflates memory-bound operators
        step()
    best = {name: min(seconds) * 1e3 for name, seconds in phases.items()}
    print(
        f"shape {args.shape}, dropout {args.dropout}, each phase's best of {args.steps} updates "
        "without the profiler, ms:"
    )
    print(
        ", ".join(f"{name} {ms:.1f}" for name, ms in best.items()),
        f"(sum {sum(best.values()):.1f})",
    )
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    print(f"shape {args.shape}, {args.steps} updates, torch {torch.__version__}")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
