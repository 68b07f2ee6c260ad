"""Which CTranslate2 settings pay on this CPU: decode_speed.py's model and batch, exported to
CTranslate2, decoded greedy and with beam 4 under each setting below, beside Hugging Face
`generate()` in the same run.

    python benchmarks/ct2_settings.py [--compute-type int8|float32] [decode_speed.py's model,
        batch and timing options]

Settings (each in a process of its own, the calls alternating as in decode_speed.py):
- as aiayn ships (`aiayn.inference.ct2.thread_split`): one single-threaded replica per thread,
  the batch split among them;
- CTranslate2's own default: one replica running all threads;
- twice as many single-threaded replicas as threads;
- `return_scores=False` (aiayn asks for scores: translate.py writes them);
- the environment variables CTranslate2 reads: `CT2_FORCE_CPU_ISA=AVX512` (never chosen by
  CTranslate2 itself; only on CPUs with AVX-512 F/CD/VL/DQ/BW), `CT2_PACKED_GEMM=0` (MKL's
  pre-packed weights off), and the other GEMM library (`CT2_USE_MKL=0` on Intel CPUs, where
  MKL is the default; `=1` elsewhere).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from decode_speed import arguments, best_times, ct2_engine, engine, print_setting, start, stop

from aiayn.inference.ct2 import thread_split
from aiayn.kernels.machine import cpu_flags, cpu_vendor

AVX512 = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")  # what CTranslate2 checks
VARIABLES = ("CT2_FORCE_CPU_ISA", "CT2_PACKED_GEMM", "CT2_USE_MKL")  # unset unless a row sets it
Setting = tuple[str, dict[str, str | None], int, int, dict[str, object]]


def settings(threads: int) -> list[Setting]:
    """(label, environment, replicas, threads per replica, `translate_batch` options); each
    environment unsets the `VARIABLES` it does not set, whatever the shell has."""
    inter, intra = thread_split("cpu", 0, 0)
    mkl = "0" if cpu_vendor() == "GenuineIntel" else "1"  # the library CTranslate2 does not pick
    variables = [("CT2_PACKED_GEMM", "0"), ("CT2_USE_MKL", mkl)]
    if len(cpu_flags(AVX512)) == len(AVX512):
        variables.insert(0, ("CT2_FORCE_CPU_ISA", "AVX512"))
    rows = [
        ("as aiayn ships", {}, inter, intra, {}),
        ("CTranslate2's default: 1 replica", {}, 1, threads, {}),
        (f"{2 * inter} replicas", {}, 2 * inter, 1, {}),
        ("return_scores=False", {}, inter, intra, {"return_scores": False}),
        *((f"{key}={value}", {key: value}, inter, intra, {}) for key, value in variables),
    ]
    return [(label, {**dict.fromkeys(VARIABLES), **env}, *rest) for label, env, *rest in rows]


def main() -> None:
    args = arguments(__doc__.splitlines()[0], (("compute-type", "int8"),))
    print_setting(args)
    rows = settings(args.threads)
    makers = [
        partial(ct2_engine, args, args.compute_type, inter, intra, **options)
        for _, _, inter, intra, options in rows
    ]
    conns, workers = start(
        [*makers, partial(engine, "HF", args)], [env for _, env, *_ in rows] + [{}]
    )
    times = {beams: best_times(conns, beams, args.repeats) for beams in (1, 4)}
    stop(conns, workers)
    print(
        f"CTranslate2 {args.compute_type}, sentences/s; HF generate(): "
        + ", ".join(
            f"{args.batch_size / times[b][-1]:.1f} ({'greedy' if b == 1 else 'beam 4'})"
            for b in times
        )
    )
    print("| setting | replicas x threads | greedy | / HF | beam 4 | / HF |")
    print("|---|---|---:|---:|---:|---:|")
    for i, (label, _, inter, intra, _) in enumerate(rows):
        cells = " | ".join(
            f"{args.batch_size / times[b][i]:.1f} | {times[b][-1] / times[b][i]:.2f}x"
            for b in times
        )
        print(f"| {label} | {inter} x {intra} | {cells} |")


if __name__ == "__main__":
    main()
