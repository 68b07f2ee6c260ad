"""Where a training update's time goes: aiayn's real update (the LightningModule's loss, backward,
its optimizer's step) at one of `train_speed.py`'s shapes, with malloc keeping freed memory as
in train.py (`aiayn.kernels.allocator`). Prints the wall-clock time of each phase (the best of
each over `--steps` unprofiled updates) and their sum, then `torch.profiler`'s operators by
total CPU time over as many more. Since 9a37359 the output layer's gradient products run in the
forward pass (`projected_label_smoothed_loss`), so "forward and loss" holds them and "backward"
does not.

    python benchmarks/profile_step.py [--shape small] [--steps 5] [--rows 25] [--dropout 0.1]
    python benchmarks/profile_step.py --device cuda --shape base --batch-size 520 \
        --src-len 48 --tgt-len 48 --vocab 37000 [--compile | --variant static|graphs]

On a GPU (`--device cuda`, bf16 autocast as train.py's bf16-mixed, `kernels=gpu`): the wall
time of an update (best of `--steps`, synchronised), the host's time to issue one (the mean of
`--steps` updates in a row without synchronising: equal to the wall time when the host is what
limits), the GPU's busy time (its kernels' summed time), the kernel launches per update, the
host-device synchronisations per update, then the `--rows` kernels by GPU time and the
operators most often called. Only the interface `train_speed.py` has had since f5393e6
(`aiayn_step`, `random_batch`, `SHAPES`) is used, so the script profiles an older checkout's
update too, from that checkout's `benchmarks/`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.kernels.allocator import keep_freed_memory

sys.path.insert(0, str(Path(__file__).parent))
import train_speed
from train_speed import DROPOUT, SHAPES, aiayn_step, random_batch

# how aiayn's loss is compiled; an older checkout's train_speed.py knows the first two only
VARIANTS = getattr(train_speed, "VARIANTS", {"eager": None, "compiled": None})


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
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--compile", action="store_true", help="aiayn with compile=true")
    parser.add_argument(
        "--variant",
        default="eager",
        choices=sorted(VARIANTS),
        help="how aiayn's loss is compiled (train_speed.py's VARIANTS; GPU only)",
    )
    args = parser.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA GPU here")
        return profile_cuda(args)
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


LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def profile_cuda(args: argparse.Namespace) -> None:
    import time

    from torch.autograd import DeviceType

    from aiayn.kernels import resolve, use

    torch.backends.cuda.matmul.allow_tf32 = True
    use(resolve("auto", on_gpu=True))  # train.py's kernels=auto on a GPU, in this checkout
    device = torch.device("cuda")
    batch = random_batch(args, device)
    variant = "compiled" if args.compile else args.variant
    build = aiayn_step(SHAPES[args.shape], args.vocab, batch, variant, dropout=args.dropout)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            build()

    for _ in range(3):  # warm-up (and compilation)
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    host = (time.perf_counter() - start) / args.steps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    per_step = {
        "launches": sum(e.count for e in events if e.key in LAUNCHES) / args.steps,
        "syncs": sum(e.count for e in events if e.key in SYNCS) / args.steps,
        "gpu busy ms": sum(
            e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA
        )
        / 1e3
        / args.steps,
    }
    tokens = args.batch_size * args.tgt_len
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; shape {args.shape}, "
        f"batch {args.batch_size} x {args.src_len} + {args.tgt_len} ({tokens} target tokens), "
        f"vocab {args.vocab}, dropout {args.dropout}, bf16 autocast"
        f"{'' if variant == 'eager' else ', ' + variant}"
    )
    print(
        f"per update: wall {min(walls) * 1e3:.1f} ms (best of {args.steps}), host issue "
        f"{host * 1e3:.1f} ms, GPU busy {per_step['gpu busy ms']:.1f} ms, "
        f"{per_step['launches']:.0f} kernel launches, {per_step['syncs']:.0f} synchronisations; "
        f"{tokens / min(walls):.0f} target tokens/s"
    )
    print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB (the process)")
    print(events.table(sort_by="self_device_time_total", row_limit=args.rows))
    print("operators most often called (per profiled updates):")
    print(events.table(sort_by="count", row_limit=args.rows))


if __name__ == "__main__":
    main()
