"""Data pipeline speed on Multi30k en-de: prepare from scratch (read, BPE training, encoding,
writing the cache; target < 15 s), a cache hit, and one epoch of train batches (batches/s).

    python benchmarks/prepare_speed.py [--root ../shared/data/multi30k] [--max-tokens 4096]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from aiayn.config import to_schema
from aiayn.data.config import DataConfig
from aiayn.data.datamodule import TranslationDataModule
from aiayn.data.prepare import load_manifest

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--max-tokens", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        node = OmegaConf.merge(
            OmegaConf.load(ROOT / "conf" / "data" / "multi30k.yaml"),
            {"root": args.root, "cache_dir": cache_dir, "max_tokens": args.max_tokens},
        )
        dm = TranslationDataModule(to_schema(node, DataConfig))
        start = time.perf_counter()
        dm.prepare_data()
        total = time.perf_counter() - start
        start = time.perf_counter()
        dm.prepare_data()
        hit = time.perf_counter() - start
        rows = list(load_manifest(dm.cache_path)["seconds"].items())
        rows += [("prepare total", total), ("prepare again (cache hit)", hit)]

        dm.setup("fit")
        start = time.perf_counter()
        batches = sum(1 for _ in dm.train_dataloader())
        epoch = time.perf_counter() - start
        rows.append((f"train epoch: {batches} batches", epoch))

    print(f"{'stage':<32} {'seconds':>8}")
    for stage, seconds in rows:
        print(f"{stage:<32} {seconds:>8.3f}")
    print(f"batches/s: {batches / epoch:.0f}   padding efficiency: {dm.padding_efficiency:.3f}")
    print(f"prepare under 15 s: {'yes' if total < 15 else 'NO'}")


if __name__ == "__main__":
    main()
