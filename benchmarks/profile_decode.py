"""Where a decode's time goes: `torch.profiler` over one call of aiayn's `generate` on
`decode_speed.py`'s model and batch (greedy or beam), as it ships or with every float32
product on MKL (`AIAYN_ONEDNN=0`); prints the best of `--repeats` timed calls and the
operators by their own CPU time.

    python benchmarks/profile_decode.py [--beams 1] [--mkl] [--repeats 5] [--rows 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from decode_speed import engine
from machine import describe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--mkl", action="store_true", help="every product on MKL")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    model = dict(d_model=256, heads=4, layers=3, ffn=1024, vocab=8000, threads=2)
    shape = argparse.Namespace(**model, batch_size=32, src_len=20, new_tokens=30)
    info = describe()
    print(f"machine: {info['cpu']}, flags {info['flags']}, fp32 peak {info['fp32_gflops']}")
    print(f"torch {torch.__version__}, model and batch of decode_speed.py")
    run = engine("aiayn MKL" if args.mkl else "aiayn", shape)
    run(args.beams)  # warm-up
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        run(args.beams)
        best = min(best, time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(args.beams)
    library = "MKL" if args.mkl else "as shipped"
    print(f"beams {args.beams}, products {library}: best of {args.repeats} {best * 1e3:.0f} ms")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
