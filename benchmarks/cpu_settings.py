"""Threads, data-loader workers and malloc on a CPU: the real training command
(`python train.py experiment=multi30k_cpu`, here for `--updates` updates without validation)
with each combination of torch threads, `data.num_workers` and `AIAYN_KEEP_FREED_MEMORY`
(1: malloc keeps freed memory for reuse, what train.py does; 0: glibc's default; see
`aiayn.kernels.allocator`), one after another; prints training tokens/s (the run's mean
`train/tokens_per_sec`), its peak RSS and the machine.

    python benchmarks/cpu_settings.py [--updates 30] [--threads 1,2] [--workers 0,1]
        [--keep-memory 1,0]

Run it on an idle machine: other processes on the same cores change every number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from aiayn.kernels.machine import describe

REPO = Path(__file__).resolve().parent.parent


def measure(threads: int, workers: int, keep: int, updates: int) -> tuple[float, float]:
    """Mean training tokens/s and peak RSS (GB) of one short run with these settings."""
    with tempfile.TemporaryDirectory() as logs:
        overrides = [
            "experiment=multi30k_cpu",
            f"trainer.max_steps={updates}",
            "trainer.max_time=null",
            "trainer.limit_val_batches=0",
            "test=false",
            "logger=csv",
            "trainer.enable_progress_bar=false",
            f"data.num_workers={workers}",
            f"paths.log_dir={logs}",
        ]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "AIAYN_KEEP_FREED_MEMORY": str(keep),
            "WANDB_MODE": "offline",
        }
        with tempfile.TemporaryFile() as output:
            command = [sys.executable, "train.py", *overrides]
            process = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=output)
            _, status, usage = os.wait4(process.pid, 0)  # usage: this child's own peak RSS
            if status != 0:
                output.seek(0)
                raise SystemExit(f"{' '.join(command)} failed:\n{output.read().decode()[-3000:]}")
        (metrics,) = Path(logs).glob("train/runs/*/metrics.json")
        rate = json.loads(metrics.read_text())["train_tokens_per_sec"]
        return rate, usage.ru_maxrss / 1e6  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--workers", default="0,1")
    parser.add_argument("--keep-memory", default="1,0")
    args = parser.parse_args()
    info = describe()
    print(f"machine: {info['cpu']}, {os.cpu_count()} cores, flags {info['flags']}")
    print(f"fp32 matmul peak {info['fp32_gflops']} GFLOP/s; torch {info['torch']}")
    print(f"experiment=multi30k_cpu, {args.updates} updates per run, no validation")
    print("| torch threads | data.num_workers | malloc keeps freed memory | tokens/s | peak RSS |")
    print("|---:|---:|---:|---:|---:|")
    for threads in map(int, args.threads.split(",")):
        for workers in map(int, args.workers.split(",")):
            for keep in map(int, args.keep_memory.split(",")):
                rate, rss = measure(threads, workers, keep, args.updates)
                kept = "yes" if keep else "no"
                print(f"| {threads} | {workers} | {kept} | {rate:.0f} | {rss:.2f} GB |", flush=True)


if __name__ == "__main__":
    main()
