"""Print the machine a benchmark or a recorded run ran on: CPU model, SIMD flags, threads,
and the measured fp32 (and bf16, where the CPU has native support) matrix-multiply peak
(`aiayn.kernels.machine`).

    python benchmarks/machine.py [--size 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse

from aiayn.kernels.machine import describe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for key, value in describe(args.size, args.repeats).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
