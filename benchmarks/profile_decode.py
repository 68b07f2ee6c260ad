"""Where a decode's time goes: aiayn's `generate` on `decode_speed.py`'s model and batch
(greedy or beam, on weights packed once as `decode_speed.py` decodes), as it ships or with
every float32 product on MKL (`AIAYN_ONEDNN=0`). Prints the best of `--repeats` timed calls,
then the phases of that call timed without the profiler (the encoder; the decoder layers and
the output layer summed over the steps; the cache's reorders; the rest: embeddings, the
log-softmax and the search itself), then `torch.profiler`'s operators by their own CPU time
over one more call (the profiler reads memory-bound operators high: compare phases, not its
shares of them).

    python benchmarks/profile_decode.py [--beams 1] [--mkl] [--repeats 5] [--rows 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.kernels.linear import CPUOutputProjection
from aiayn.model.cache import KVCache
from aiayn.model.transformer import Decoder, Transformer

sys.path.insert(0, str(Path(__file__).parent))
from decode_speed import engine
from machine import describe

PHASES = {  # name: (class, method) whose calls it sums
    "encoder": (Transformer, "encode"),
    "decoder layers": (Decoder, "forward"),
    "output layer": (CPUOutputProjection, "forward"),  # aiayn as shipped on the CPU
    "cache reorders": (KVCache, "reorder"),
}


@contextmanager
def timed_phases(spent: Counter[str]) -> Iterator[None]:
    """Inside the block each call of a `PHASES` method adds its seconds to ``spent[name]``."""
    originals = {name: getattr(cls, method) for name, (cls, method) in PHASES.items()}

    def timed(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return run

    for name, (cls, method) in PHASES.items():
        setattr(cls, method, timed(name, originals[name]))
    try:
        yield
    finally:
        for name, (cls, method) in PHASES.items():
            setattr(cls, method, originals[name])


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
    best, phases = float("inf"), Counter()
    for _ in range(args.repeats):
        spent: Counter[str] = Counter()
        with timed_phases(spent):
            start = time.perf_counter()
            run(args.beams)
            seconds = time.perf_counter() - start
        if seconds < best:
            best, phases = seconds, spent
    library = "MKL" if args.mkl else "as shipped"
    print(f"beams {args.beams}, products {library}: best of {args.repeats} {best * 1e3:.1f} ms")
    phases["the rest"] = best - sum(phases.values())
    print(", ".join(f"{name} {phases[name] * 1e3:.1f} ms" for name in [*PHASES, "the rest"]))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(args.beams)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
