"""Prepare once, load fast: read a corpus, train (or load) the tokenizer, binarize into a cache.

Cache directory `{cache_dir}/{source}-{src}-{tgt}-{key}`, key = hash of the source's input
fingerprint (see `sources/`: a `stat` of each file) and every setting that changes the
content (tokenizer settings, max_len, max_ratio, languages, splits, fields). Batching
settings (max_tokens, num_workers) are not part of it. Contents, per role train/val/test:

    {role}.src.tokens.npy  (N_tokens,) uint16|int32   all source ids, no specials, flat
    {role}.src.offsets.npy (N + 1,) int64             example i is tokens[off[i]:off[i+1]]
    {role}.tgt.*           the same for the target side
    {role}.jsonl           {"src": ..., "tgt": ...} original text, line i = example id i
                           (val and test only: BLEU and samples read it, training does not)
    tokenizer.json (joint) or tokenizer.src.json + tokenizer.tgt.json
    manifest.json          settings, counts, filtered counts, timings; written last
    {role}.plan-{max_tokens}.{order,bounds}.npy + .json
                           the split's batches at that budget (`BatchPlan`), built for
                           data.max_tokens once the cache is whole, for another budget on
                           first use; memory-mapped by every rank

The train split is streamed from the source three times (a scan for empty pairs, the
tokenizer's training, twice for separate tokenizers, and the encoding, ENCODE_CHUNK pairs at
a time), so memory holds its ids, never its text; val and test are read whole.

Train pairs with an empty side, a side longer than max_len tokens, or a length ratio above
max_ratio are dropped (counted in the manifest). Val/test keep every pair (BLEU needs all);
over-long sides are truncated to max_len tokens with a warning. Everything is written into a
temp dir that is renamed into place only when complete, so an interrupted or failed prepare
leaves no cache that a later run trusts. Processes that start together (the ranks of a
`torchrun` or `srun` launch, a sweep's jobs) take turns on a lock file in
`<cache_dir>/.locks/`: one prepares, the others wait and read its cache.

Run alone: `aiayn prepare data=multi30k data.root=...` (`aiayn.cli.prepare`) prints the report.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from aiayn.console import Advance, Stages, progress
from aiayn.data.config import ROLES, DataConfig
from aiayn.data.dataset import SplitDataset
from aiayn.data.sources import Source, get_source
from aiayn.data.sources.text import file_fingerprint
from aiayn.data.tokenizer import SIDES, Tokenizers, train_tokenizer
from aiayn.errors import DataError, writing
from aiayn.schema import PathsConfig

log = logging.getLogger(__name__)

CACHE_VERSION = 1
MANIFEST = "manifest.json"
ENCODE_CHUNK = 100_000  # sentences per encode_batch call (bounds memory on WMT-size corpora)


@dataclass
class PrepareConfig:
    """Everything `aiayn prepare` reads (conf/prepare.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)
    progress: bool = True  # progress bars (on a terminal only)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "prepare"


def _settings(cfg: DataConfig) -> dict[str, object]:
    tokenizer = asdict(cfg.tokenizer)
    if tokenizer["model"] == "bpe":  # the default: caches written before the key keep theirs
        del tokenizer["model"]
    if cfg.tokenizer.path:
        path = Path(cfg.tokenizer.path)
        files = [path] if path.is_file() else sorted(path.glob("tokenizer*.json"))
        tokenizer["path"] = [file_fingerprint(file) for file in files]
    return {
        "source": cfg.source,
        "langs": [cfg.src_lang, cfg.tgt_lang],
        "splits": cfg.split_names,
        "fields": [*cfg.fields, cfg.parent_field],
        "tokenizer": tokenizer,
        "max_len": cfg.max_len,
        "max_ratio": cfg.max_ratio,
    }


def cache_path(cfg: DataConfig) -> Path:
    """Where the cache for these inputs and settings lives (cheap: hashes files up to
    `CONTENT_BYTES` once per process, only stats bigger ones; `sources.text.file_fingerprint`)."""
    inputs = get_source(cfg).fingerprint()
    identity = {"version": CACHE_VERSION, "inputs": inputs, "settings": _settings(cfg)}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cfg.cache_dir) / f"{cfg.source}-{cfg.src_lang}-{cfg.tgt_lang}-{key}"


def load_manifest(path: Path) -> dict | None:
    """The manifest of a complete cache at path, else None."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("complete") else None


def prepare(cfg: DataConfig) -> Path:
    """Build the cache for cfg unless a complete one exists, and its splits' batch plans for
    cfg.max_tokens unless they exist; return its path. Idempotent."""
    path = cache_path(cfg)
    if load_manifest(path) is not None:
        if _plans_saved(path, cfg.max_tokens):
            log.debug("data cache hit: %s", path)
            return path
        if not os.access(path, os.W_OK):  # a shared read-only cache: setup plans in memory
            log.debug("data cache hit: %s (read-only)", path)
            return path
    _writable(path.parent)
    with _only_one_preparing(path):
        if load_manifest(path) is None:
            _build_into(cfg, path)
        for role in ROLES:  # each a no-op where another process saved it while this one waited
            SplitDataset(path, role).batch_plan(cfg.max_tokens)
    return path


def _writable(directory: Path) -> None:
    """Create `directory` (data.cache_dir) if needed; a DataError if it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if os.access(directory, os.W_OK | os.X_OK):
            return
        problem = "it is not writable"
    except OSError as error:
        problem = f"{error.strerror or error}"
    raise DataError(
        f"cannot prepare the data cache in {directory} ({problem}): set data.cache_dir to a "
        "directory this user can write"
    )


def _plans_saved(path: Path, max_tokens: int) -> bool:
    """Whether every split's plan for max_tokens is saved whole and current (an older
    PLAN_VERSION's is rebuilt here, once, not by every rank)."""
    return all(SplitDataset(path, role).saved_plan(max_tokens) is not None for role in ROLES)


@contextmanager
def _only_one_preparing(path: Path) -> Iterator[None]:
    """Hold the cache's lock file: of the processes that start together (DDP ranks under
    torchrun or srun, jobs of a sweep) one prepares and the others wait, then read its cache."""
    locks = path.parent / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    lock = FileLock(locks / f"{path.name}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("data cache %s: another process is preparing it; waiting", path)
        lock.acquire()
    except (NotImplementedError, OSError) as error:  # a filesystem without locks (some NFS)
        log.warning("data cache %s: no file lock here (%s); preparing unlocked", path, error)
        lock = None  # the cache still appears whole (a rename); each process may build it
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _build_into(cfg: DataConfig, path: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        manifest = _build(cfg, tmp)
        tmp.chmod(0o755)  # mkdtemp's 0o700 would hide the cache from other users
        if path.exists() and load_manifest(path) is None:
            shutil.rmtree(path)  # not ours to trust: incomplete or foreign
        try:
            os.rename(tmp, path)
        except OSError:
            if load_manifest(path) is None:
                raise
            log.info("another process prepared %s first; using it", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("prepared data cache %s\n%s", path, report(manifest))
    return path


Ids = tuple[np.ndarray, np.ndarray]  # (flat token ids (N_tokens,), lengths (N,) int64)


def _get_tokenizers(cfg: DataConfig, source: Source, keep: np.ndarray) -> Tokenizers:
    """The given tokenizer, or one trained on the train pairs `keep` marks, streamed from the
    source to the trainer (one more read of the train split per tokenizer)."""
    if cfg.tokenizer.path:
        return Tokenizers.load(cfg.tokenizer.path)
    count = int(keep.sum())
    if cfg.tokenizer.joint:
        pairs = itertools.compress(source.pairs("train"), keep)
        texts = (text for pair in pairs for text in pair)
        return Tokenizers(train_tokenizer(texts, cfg.tokenizer, 2 * count))
    src, tgt = (map(itemgetter(k), itertools.compress(source.pairs("train"), keep)) for k in (0, 1))
    return Tokenizers(
        train_tokenizer(src, cfg.tokenizer, count), train_tokenizer(tgt, cfg.tokenizer, count)
    )


def _encode(
    tokenizers: Tokenizers, pairs: Iterable[tuple[str, str]], dtype: type, advance: Advance
) -> dict[str, Ids]:
    """Side -> the ids of every text as one flat array and the lengths, encoded ENCODE_CHUNK
    pairs at a time (in parallel, in Rust): memory is the ids' own size and one chunk's text,
    not the corpus's."""
    flats = {side: [np.zeros(0, dtype)] for side in SIDES}
    lengths = {side: [np.zeros(0, np.int64)] for side in SIDES}
    pairs = iter(pairs)
    while chunk := list(itertools.islice(pairs, ENCODE_CHUNK)):
        for side, texts in zip(SIDES, zip(*chunk, strict=True), strict=True):
            rows = tokenizers.encode(list(texts), side)
            lengths[side].append(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)))
            count = int(lengths[side][-1].sum())
            ids = itertools.chain.from_iterable(rows)
            flats[side].append(np.fromiter(ids, dtype=dtype, count=count))
        advance(len(chunk))
    return {side: (np.concatenate(flats[side]), np.concatenate(lengths[side])) for side in SIDES}


def _where(source: Source, role: str) -> str:
    """` (<its files>)` of a split, for messages ('' for a source without files)."""
    files = ", ".join(str(f) for f in getattr(source, "files", dict)().get(role, []))
    return f" ({files})" if files else ""


def _check_sides(
    cfg: DataConfig, source: Source, role: str, sources: list[str], references: list[str]
) -> None:
    """A val/test split whose source or target side is all empty is refused (a wrong file or
    field: there is nothing to translate, or its BLEU would mean nothing); some empty
    references get a warning with their count."""
    key = f"data.{role}_split={cfg.split_names[role]}"
    if not any(text.strip() for text in sources):
        raise DataError(
            f"every source line of the {role} split is empty ({key}{_where(source, role)}): "
            f"there is nothing to translate; fix the source file or field, or pick another "
            f"split with {key.split('=')[0]}=<name>"
        )
    empty = sum(1 for reference in references if not reference.strip())
    if empty == len(references):
        raise DataError(
            f"every reference (target line) of the {role} split is empty ({key}"
            f"{_where(source, role)}): BLEU against it means nothing; fix the target file or "
            f"pick another split with {key.split('=')[0]}=<name>"
        )
    if empty:
        log.warning(
            "%s split (%s%s): %d of %d references are empty; their sentences can only score "
            "as misses in BLEU",
            role,
            key,
            _where(source, role),
            empty,
            len(references),
        )


def _nonempty(pairs: Iterable[tuple[str, str]]) -> np.ndarray:
    """(N,) bool: the pairs with text on both sides (read through, none kept)."""
    return np.fromiter((bool(s.strip() and t.strip()) for s, t in pairs), bool)


def _filter_train(cfg: DataConfig, nonempty: np.ndarray, src: Ids, tgt: Ids) -> tuple:
    """(kept (N,) bool, {'empty', 'too_long', 'ratio'} counts of the dropped train pairs)."""
    short, long = np.minimum(src[1], tgt[1]), np.maximum(src[1], tgt[1])
    too_long = nonempty & (long > cfg.max_len)
    ratio = nonempty & ~too_long & (long > cfg.max_ratio * short)
    kept = nonempty & ~too_long & ~ratio
    counts = {"empty": int((~nonempty).sum()), "too_long": int(too_long.sum())}
    return kept, {**counts, "ratio": int(ratio.sum())}


def _rows(ids: Ids, rows: np.ndarray) -> Ids:
    """The rows that the (N,) bool `rows` marks."""
    flat, lengths = ids
    return flat[np.repeat(rows, lengths)], lengths[rows]


def _truncated(ids: Ids, max_len: int) -> Ids:
    """Every row cut to its first max_len ids."""
    flat, lengths = ids
    starts = np.cumsum(lengths) - lengths
    position = np.arange(len(flat)) - np.repeat(starts, lengths)
    return flat[position < max_len], np.minimum(lengths, max_len)


def _write_split(out: Path, role: str, ids: dict[str, Ids]) -> None:
    for side, (flat, lengths) in ids.items():
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(out / f"{role}.{side}.tokens.npy", flat)
        np.save(out / f"{role}.{side}.offsets.npy", offsets)


def _write_texts(out: Path, role: str, src: list[str], tgt: list[str]) -> None:
    with (out / f"{role}.jsonl").open("w", encoding="utf-8") as file:
        for s, t in zip(src, tgt, strict=True):
            file.write(json.dumps({"src": s, "tgt": t}, ensure_ascii=False) + "\n")


def _build(cfg: DataConfig, out: Path) -> dict:
    """Write the whole cache into `out` (manifest last) and return the manifest; a progress
    bar per stage (read, tokenizer, encode, write) on a terminal."""
    with progress() as bars:
        return _build_stages(cfg, out, bars)


def _build_stages(cfg: DataConfig, out: Path, bars: Stages) -> dict:
    """The train split is streamed from the source three times (scan, tokenizer, encode; four
    with separate tokenizers) and never held in memory as text; val and test are read once."""
    source = get_source(cfg)
    inputs = source.fingerprint()
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    advance = bars.stage("read splits", total=len(ROLES))
    nonempty = _nonempty(source.pairs("train"))
    advance(1)
    texts: dict[str, tuple[list[str], list[str]]] = {}
    for role in (r for r in ROLES if r != "train"):
        texts[role] = source.read(role)
        advance(1)
    sizes = {"train": len(nonempty), **{role: len(texts[role][0]) for role in texts}}
    for role, size in sizes.items():
        if not size:
            raise DataError(
                f"the {role} split ({cfg.split_names[role]}) of {cfg.source} is empty"
                f"{_where(source, role)}: it needs at least one sentence pair"
            )
    for role, (sources, references) in texts.items():
        _check_sides(cfg, source, role, sources, references)
    seconds["read"] = time.perf_counter() - start

    start = time.perf_counter()
    if not nonempty.any():
        raise DataError(f"the train split of {cfg.source} has no pair with two non-empty sides")
    advance = bars.stage("train tokenizer" if not cfg.tokenizer.path else "load tokenizer", 1)
    tokenizers = _get_tokenizers(cfg, source, nonempty)
    advance(1)
    seconds["tokenizer"] = time.perf_counter() - start

    start = time.perf_counter()
    vocab = max(tokenizers.src_vocab_size, tokenizers.tgt_vocab_size)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    advance = bars.stage("encode", total=sum(sizes.values()))
    encoded = {"train": _encode(tokenizers, source.pairs("train"), dtype, advance)}
    if len(encoded["train"]["src"][1]) != len(nonempty) or source.fingerprint() != inputs:
        raise DataError(
            f"the train split of {cfg.source} changed while it was being prepared (it is read "
            "more than once): prepare again when nothing is writing to it"
        )
    for role, (src, tgt) in texts.items():
        encoded[role] = _encode(tokenizers, zip(src, tgt, strict=True), dtype, advance)
    seconds["encode"] = time.perf_counter() - start

    start = time.perf_counter()
    # the ids and offsets, and the val/test texts as JSON lines (characters as bytes)
    ids_bytes = sum(f.nbytes + 8 * len(n) for sides in encoded.values() for f, n in sides.values())
    text_chars = sum(len(t) for role in texts for side in texts[role] for t in side)
    kept = "; no cache was written, earlier caches are intact"
    with writing(cache_path(cfg), ids_bytes + 2 * text_chars, kept):
        splits = _write_cache(cfg, out, texts, encoded, nonempty, bars)
        tokenizer_files = [p.name for p in tokenizers.save(out)]
    seconds["write"] = time.perf_counter() - start

    manifest = {
        "version": CACHE_VERSION,
        "settings": _settings(cfg),
        "inputs": inputs,
        "splits": splits,
        "src_vocab_size": tokenizers.src_vocab_size,
        "tgt_vocab_size": tokenizers.tgt_vocab_size,
        "joint": tokenizers.joint,
        "tokenizer_files": tokenizer_files,
        "dtype": np.dtype(dtype).name,
        "seconds": {stage: round(value, 3) for stage, value in seconds.items()},
        "complete": True,
    }
    with writing(cache_path(cfg), None, kept):
        text = json.dumps(manifest, indent=1, ensure_ascii=False)
        (out / MANIFEST).write_text(text, encoding="utf-8")
    return manifest


def _write_cache(
    cfg: DataConfig,
    out: Path,
    texts: dict[str, tuple[list[str], list[str]]],
    encoded: dict[str, dict[str, Ids]],
    nonempty: np.ndarray,
    bars: Stages,
) -> dict[str, dict]:
    """Filter train, truncate val/test, write every split's ids (and val/test's texts, which
    BLEU and the samples need) into `out`; per-split info."""
    splits: dict[str, dict] = {}
    advance = bars.stage("write cache", total=len(ROLES))
    for role in ROLES:
        ids = encoded[role]
        info: dict[str, object] = {"lines": len(ids["src"][1])}
        if role == "train":
            kept, info["filtered"] = _filter_train(cfg, nonempty, ids["src"], ids["tgt"])
            if not kept.any():
                raise DataError(
                    f"every train pair was filtered out ({info['filtered']}): raise "
                    f"data.max_len ({cfg.max_len}) or data.max_ratio ({cfg.max_ratio})"
                )
            ids = {side: _rows(ids[side], kept) for side in SIDES}
        else:
            long = sum(int((ids[side][1] > cfg.max_len).sum()) for side in SIDES)
            if long:
                log.warning(
                    "%s: truncated %d over-long side(s) to max_len=%d", role, long, cfg.max_len
                )
            ids = {side: _truncated(ids[side], cfg.max_len) for side in SIDES}
            info["truncated"] = long
            _write_texts(out, role, *texts[role])
        _write_split(out, role, ids)
        info.update(
            examples=len(ids["src"][1]),
            src_tokens=int(ids["src"][1].sum()),
            tgt_tokens=int(ids["tgt"][1].sum()),
        )
        splits[role] = info
        advance(1)
    return splits


def report(manifest: dict) -> str:
    """Human-readable summary: examples, tokens, filtered/truncated counts, vocab, timings."""
    vocab = f"src {manifest['src_vocab_size']} tgt {manifest['tgt_vocab_size']}"
    lines = [f"vocab: {vocab} (joint: {manifest['joint']})"]
    for role, info in manifest["splits"].items():
        extra = info.get("filtered", {"truncated": info.get("truncated", 0)})
        details = " ".join(f"{name}={count}" for name, count in extra.items())
        lines.append(
            f"{role:5s}: {info['examples']:>9d} of {info['lines']:>9d} pairs, "
            f"{info['src_tokens']:>10d} src / {info['tgt_tokens']:>10d} tgt tokens; {details}"
        )
    lines.append("seconds: " + " ".join(f"{k}={v}" for k, v in manifest["seconds"].items()))
    return "\n".join(lines)


if __name__ == "__main__":  # the documented `python -m aiayn.data.prepare`
    from aiayn.cli.prepare import main

    main()
