"""The data pipeline at WMT14 en-de size (4.5M pairs), on a generated corpus: nothing is
downloaded. Prints the machine, then one table: prepare time by stage, peak RSS of prepare,
cache size, time from process start to the first training batch, and per DDP rank in a short
training run its private (anonymous) memory, the memory-mapped cache pages it maps (shared
page cache) and its peak RSS, against the same training run on a 29k-pair corpus.

    python benchmarks/wmt_size.py [--pairs 4500000] [--dir /tmp/aiayn-wmt-size] [--skip-train]

The corpus: English-like and German-like sentences of synthetic words (a Zipfian vocabulary
of 200k word types built from syllables, umlauts on the German side), sentence lengths
log-normal like WMT14's (median ~21 words, a tail past 100), the German length the English
one times a log-normal ratio. Generated once into --dir (about 1.5 GB for 4.5M pairs) and
reused; each prepare starts from an empty cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SYLLABLES = {
    "en": str.split("ba be bi bo bu ca ce co da de di do en er es in is on or re st th ti to un"),
    "de": str.split("ä ö ü ch sch ei ie au en er ge be de ka ma na ra sa ta te un ver zu st"),
}
VAL_TEST = 3000
SAMPLE_S = 0.1  # how often the memory of the command's processes is read


def words(lang: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` distinct synthetic words of 1-4 syllables."""
    syllables = np.array(SYLLABLES[lang])
    found: dict[str, None] = {}
    while len(found) < count:
        sizes = rng.integers(1, 5, size=count)
        for size in sizes:
            found["".join(rng.choice(syllables, size))] = None
            if len(found) == count:
                break
    return np.array(list(found), dtype=object)


def generate(directory: Path, pairs: int, seed: int = 0) -> None:
    """train/val/test .en/.de files of `pairs` + 2 x VAL_TEST generated pairs."""
    rng = np.random.default_rng(seed)
    vocab = {lang: words(lang, 200_000, rng) for lang in ("en", "de")}
    rank = np.arange(1, 200_001)
    zipf = 1.0 / rank**1.1
    zipf /= zipf.sum()
    directory.mkdir(parents=True, exist_ok=True)
    for role, count in (("train", pairs), ("val", VAL_TEST), ("test", VAL_TEST)):
        files = {lang: (directory / f"{role}.{lang}").open("w") for lang in ("en", "de")}
        for start in range(0, count, 100_000):
            n = min(100_000, count - start)
            en_len = np.clip(rng.lognormal(np.log(21), 0.55, n), 1, 250).astype(int)
            de_len = np.clip(en_len * rng.lognormal(-0.05, 0.15, n), 1, 250).astype(int)
            for lang, lengths in (("en", en_len), ("de", de_len)):
                ids = rng.choice(len(rank), size=int(lengths.sum()), p=zipf)
                tokens = vocab[lang][ids]
                bounds = np.cumsum(lengths)
                lines = [" ".join(tokens[b - k : b]) for b, k in zip(bounds, lengths, strict=True)]
                files[lang].write(".\n".join(lines) + ".\n")
        for file in files.values():
            file.close()


def data_args(corpus: Path, cache: Path) -> list[str]:
    return [
        "data=files",
        f"data.root={corpus}",
        f"data.cache_dir={cache}",
        "data.tokenizer.vocab_size=37000",
        "data.max_tokens=4096",
    ]


# runs a command and prints the peak RSS of the largest process it started (its own children,
# DDP's other ranks included: Linux keeps the largest of the processes waited for)
MEASURED = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print("peak_rss_kb", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


@dataclass
class Usage:
    """What a command cost: seconds, and over the processes it started (GB), the largest peak
    RSS (exact, from the kernel) and the largest private (anonymous) and file-backed RSS seen
    (sampled from /proc every `SAMPLE_S` seconds). File-backed pages of the memory-mapped
    cache are page cache: shared by the ranks that map them and dropped by the kernel under
    pressure, so a rank's own memory is its anonymous RSS."""

    seconds: float
    peak_rss: float
    anon: float = 0.0
    file: float = 0.0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        found.append(pid := todo.pop())
        todo += children.get(pid, [])
    return found


def _rss_kb(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of a process in kB, (0, 0) once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0, 0
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return tuple(int(fields.get(k, "0 kB").split()[0]) for k in ("RssAnon", "RssFile"))


def timed(command: list[str]) -> tuple[Usage, str]:
    """What running `command` cost (see `Usage`) and its output."""
    start = time.perf_counter()
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    measured = [sys.executable, "-c", MEASURED, *command]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(measured, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        anon = file = 0
        while process.poll() is None:
            for pid in _descendants(process.pid)[1:]:  # the wrapper itself is not measured
                pid_anon, pid_file = _rss_kb(pid)
                anon, file = max(anon, pid_anon), max(file, pid_file)
            time.sleep(SAMPLE_S)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    seconds = time.perf_counter() - start
    if process.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    peak_kb = int(stderr.rsplit("peak_rss_kb", 1)[1].split()[0])
    return Usage(seconds, peak_kb / 2**20, anon / 2**20, file / 2**20), stdout + stderr


FIRST_BATCH = """
import sys, time, resource
started = float(sys.argv[1])
from omegaconf import OmegaConf
from aiayn.config import to_schema
from aiayn.data.config import DataConfig
from aiayn.data.datamodule import TranslationDataModule

node = OmegaConf.merge(OmegaConf.load("conf/data/files.yaml"), {
    "root": sys.argv[2], "cache_dir": sys.argv[3], "max_tokens": 4096,
    "tokenizer": {"vocab_size": 37000}})
data = TranslationDataModule(to_schema(node, DataConfig))
data.prepare_data()
data.setup("fit")
batch = next(iter(data.train_dataloader()))
print("first_batch_s", time.time() - started)
print("rss_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
"""


def first_batch(corpus: Path, cache: Path) -> tuple[float, float]:
    """(seconds from process start to the first training batch, peak RSS GB) on a prepared
    cache: what every training run pays before its first update."""
    command = [sys.executable, "-c", FIRST_BATCH, str(time.time()), str(corpus), str(cache)]
    _, output = timed(command)
    values = dict(line.split() for line in output.splitlines() if line[:3] in ("fir", "rss"))
    return float(values["first_batch_s"]), float(values["rss_gb"])


def train_rss(corpus: Path, cache: Path, logs: Path) -> Usage:
    """Memory of the largest rank of a 2-process DDP run of 30 updates (tiny model)."""
    command = [sys.executable, "train.py", *data_args(corpus, cache), "model=tiny"]
    command += ["trainer=ddp", "trainer.accelerator=cpu", "trainer.max_steps=30"]
    command += ["trainer.limit_val_batches=2", "val_bleu=false", "test=false", "logger=none"]
    command += [
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.mode=min",
    ]
    command += ["trainer.enable_progress_bar=false", f"paths.log_dir={logs}"]
    return timed(command)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/aiayn-wmt-size"))
    parser.add_argument("--skip-train", action="store_true", help="no DDP memory runs")
    parser.add_argument(
        "--reuse-cache", action="store_true", help="measure on the cache a last run prepared"
    )
    args = parser.parse_args()
    from aiayn.kernels.machine import describe

    for key, value in describe(2048, 3).items():
        print(f"{key}: {value}")
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    print(f"git: {sha.stdout.decode().strip()}")
    corpus = args.dir / f"corpus-{args.pairs}"
    if not (corpus / "test.de").is_file():
        start = time.perf_counter()
        generate(corpus, args.pairs)
        print(f"generated {args.pairs} pairs in {time.perf_counter() - start:.0f} s: {corpus}")
    cache = args.dir / "cache"
    seconds = peak = float("nan")
    if not args.reuse_cache:
        shutil.rmtree(cache, ignore_errors=True)
        prepare = [sys.executable, "-m", "aiayn.data.prepare", *data_args(corpus, cache)]
        prepare += ["progress=false", f"paths.log_dir={args.dir / 'logs'}"]
        usage = timed(prepare)[0]
        seconds, peak = usage.seconds, usage.peak_rss
    (prepared,) = [p for p in cache.iterdir() if p.name.startswith("files-")]
    manifest = json.loads((prepared / "manifest.json").read_text())
    size = sum(f.stat().st_size for f in prepared.iterdir()) / 2**30
    first, first_rss = first_batch(corpus, cache)
    rows = [
        (f"prepare: {stage}", f"{value:.1f} s", "") for stage, value in manifest["seconds"].items()
    ]
    rows += [
        ("prepare: whole command", f"{seconds:.1f} s", "<= 15 min"),
        ("prepare: peak RSS", f"{peak:.2f} GB", "<= 4 GB"),
        ("cache size", f"{size:.2f} GB", ""),
        ("start to first training batch", f"{first:.1f} s", "<= 5 s"),
        ("  its peak RSS", f"{first_rss:.2f} GB", ""),
    ]
    train = manifest["splits"]["train"]
    print(
        f"\n{train['examples']} train pairs kept of {train['lines']}, {train['src_tokens']} + "
        f"{train['tgt_tokens']} tokens, vocab {manifest['src_vocab_size']}"
    )
    if not args.skip_train:
        small = args.dir / "corpus-small"
        if not (small / "test.de").is_file():
            generate(small, 29_000, seed=1)
        runs = (("4.5M", corpus, cache), ("29k", small, args.dir / "cache-small"))
        for name, path, its_cache in runs:
            usage = train_rss(path, its_cache, args.dir / "logs")
            goal = "independent of corpus size" if name == "4.5M" else ""
            rows += [
                (f"DDP 2 ranks, a rank's private memory ({name})", f"{usage.anon:.2f} GB", goal),
                (f"  its memory-mapped files, shared ({name})", f"{usage.file:.2f} GB", ""),
                (f"  its peak RSS, both ({name})", f"{usage.peak_rss:.2f} GB", ""),
            ]
    print(f"\n| {'measure':<44} | {'value':>9} | goal |\n|---|---:|---|")
    for name, value, goal in rows:
        print(f"| {name:<44} | {value:>9} | {goal} |")


if __name__ == "__main__":
    main()
