"""oneDNN float32 products of 1 000 row counts never seen before (three products each, the
shapes of a d_model 256 / d_ff 1024 feed-forward layer): resident memory every 250 shapes.
Run once per cache setting, e.g. ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=128 LRU_CACHE_CAPACITY=128
python experiments/onednn_cache/products.py`` (experiments/onednn_cache.md)."""

import random
import time

import torch

from aiayn.kernels.machine import onednn_product


def rss_mib() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def main() -> None:
    random.seed(0)
    rows = list(range(400, 2400, 2))
    random.shuffle(rows)
    up, down = torch.randn(1024, 256), torch.randn(256, 1024)
    start, seen = time.perf_counter(), [("start", rss_mib())]
    for i, m in enumerate(rows, 1):
        hidden = onednn_product(torch.randn(m, 256), up)
        out = onednn_product(hidden, down)
        onednn_product(out, down.t().contiguous())
        if i % 250 == 0:
            seen.append((i, rss_mib()))
    print("shapes, RSS MiB:", seen, f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
