"""Threads and data-loader workers on a CPU: the real training command
(`python train.py experiment=multi30k_cpu`, here for `--updates` updates without validation)
with each combination of torch threads and `data.num_workers`, one after another; prints
training tokens/s (the run's mean `train/tokens_per_sec`) and the machine.

    python benchmarks/cpu_settings.py [--updates 30] [--threads 1,2] [--workers 0,1]

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

from aiayn.machine import describe

REPO = Path(__file__).resolve().parent.parent


def tokens_per_second(threads: int, workers: int, updates: int) -> float:
    """Mean training tokens/s of one short run with these settings."""
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
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "WANDB_MODE": "offline"}
        subprocess.run(
            [sys.executable, "train.py", *overrides],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
        (metrics,) = Path(logs).glob("train/runs/*/metrics.json")
        return json.loads(metrics.read_text())["train_tokens_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--workers", default="0,1")
    args = parser.parse_args()
    info = describe()
    print(f"machine: {info['cpu']}, {os.cpu_count()} cores, flags {info['flags']}")
    print(f"fp32 matmul peak {info['fp32_gflops']} GFLOP/s; torch {info['torch']}")
    print(f"experiment=multi30k_cpu, {args.updates} updates per run, no validation")
    print("| torch threads | data.num_workers | train tokens/s |")
    print("|---:|---:|---:|")
    for threads in map(int, args.threads.split(",")):
        for workers in map(int, args.workers.split(",")):
            rate = tokens_per_second(threads, workers, args.updates)
            print(f"| {threads} | {workers} | {rate:.0f} |", flush=True)


if __name__ == "__main__":
    main()
