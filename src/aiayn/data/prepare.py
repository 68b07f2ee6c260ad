"""Prepare once, load fast: read a corpus, train (or load) the tokenizer, binarize into a cache.

Cache directory `{cache_dir}/{source}-{src}-{tgt}-{key}`, key = hash of the source's input
fingerprint (see `sources/`: a `stat` of each file) and every setting that changes the
content (tokenizer settings, max_len, max_ratio, languages, splits, fields). Batching
settings (max_tokens, num_workers) are not part of it. Contents, per role train/val/test:

    {role}.src.tokens.npy  (N_tokens,) uint16|int32   all source ids, no specials, flat
    {role}.src.offsets.npy (N + 1,) int64             example i is tokens[off[i]:off[i+1]]
    {role}.tgt.*           the same for the target side
    {role}.jsonl           {"src": ..., "tgt": ...} original text, line i = example id i
    tokenizer.json (joint) or tokenizer.src.json + tokenizer.tgt.json
    manifest.json          settings, counts, filtered counts, timings; written last

Train pairs with an empty side, a side longer than max_len tokens, or a length ratio above
max_ratio are dropped (counted in the manifest). Val/test keep every pair (BLEU needs all);
over-long sides are truncated to max_len tokens with a warning. Everything is written into a
temp dir that is renamed into place only when complete, so an interrupted or failed prepare
leaves no cache that a later run trusts, and two racing processes both end with one cache.

Run alone: `python -m aiayn.data.prepare data=multi30k data.root=...` prints the report.
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
from dataclasses import asdict
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, PrepareConfig, register, to_schema
from aiayn.console import Advance, Stages, progress, set_progress
from aiayn.data.config import ROLES, DataConfig
from aiayn.data.sources import get_source
from aiayn.data.sources.text import file_fingerprint
from aiayn.data.tokenizer import SIDES, Tokenizers, train_tokenizer
from aiayn.errors import DataError, exit_on_error, writing

log = logging.getLogger(__name__)

CACHE_VERSION = 1
MANIFEST = "manifest.json"
ENCODE_CHUNK = 100_000  # sentences per encode_batch call (bounds memory on WMT-size corpora)


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
    """Where the cache for these inputs and settings lives (cheap: stats files, reads none)."""
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
    """Build the cache for cfg unless a complete one exists; return its path. Idempotent."""
    path = cache_path(cfg)
    if load_manifest(path) is not None:
        log.debug("data cache hit: %s", path)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
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


def _get_tokenizers(cfg: DataConfig, src: list[str], tgt: list[str]) -> Tokenizers:
    if cfg.tokenizer.path:
        return Tokenizers.load(cfg.tokenizer.path)
    if cfg.tokenizer.joint:
        return Tokenizers(
            train_tokenizer(itertools.chain(src, tgt), cfg.tokenizer, len(src) + len(tgt))
        )
    return Tokenizers(
        train_tokenizer(src, cfg.tokenizer, len(src)), train_tokenizer(tgt, cfg.tokenizer, len(tgt))
    )


def _encode(
    tokenizers: Tokenizers, texts: list[str], side: str, advance: Advance
) -> list[list[int]]:
    ids: list[list[int]] = []
    for start in range(0, len(texts), ENCODE_CHUNK):
        chunk = texts[start : start + ENCODE_CHUNK]
        ids.extend(tokenizers.encode(chunk, side))
        advance(len(chunk))
    return ids


def _filter_train(cfg: DataConfig, texts: tuple, ids: dict[str, list[list[int]]]) -> tuple:
    """Kept indices and {'empty', 'too_long', 'ratio'} counts of dropped train pairs."""
    counts = {"empty": 0, "too_long": 0, "ratio": 0}
    kept = []
    for i, (s, t) in enumerate(zip(ids["src"], ids["tgt"], strict=True)):
        short, long = sorted((len(s), len(t)))
        if not texts[0][i].strip() or not texts[1][i].strip():
            counts["empty"] += 1
        elif long > cfg.max_len:
            counts["too_long"] += 1
        elif long > cfg.max_ratio * short:
            counts["ratio"] += 1
        else:
            kept.append(i)
    return kept, counts


def _write_split(out: Path, role: str, ids: dict[str, list[list[int]]], dtype: type) -> None:
    for side in SIDES:
        rows = ids[side]
        lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=offsets[-1])
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
    source = get_source(cfg)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    advance = bars.stage("read splits", total=len(ROLES))
    texts = {}
    for role in ROLES:
        texts[role] = source.read(role)
        advance(1)
    for role, (src, _) in texts.items():
        if not src:
            files = ", ".join(str(f) for f in getattr(source, "files", dict)().get(role, []))
            where = f" ({files})" if files else ""
            raise DataError(
                f"the {role} split ({cfg.split_names[role]}) of {cfg.source} is empty{where}: "
                "it needs at least one sentence pair"
            )
    seconds["read"] = time.perf_counter() - start

    start = time.perf_counter()
    train_src, train_tgt = texts["train"]
    pairs = [(s, t) for s, t in zip(train_src, train_tgt, strict=True) if s.strip() and t.strip()]
    if not pairs:
        raise DataError(f"the train split of {cfg.source} has no pair with two non-empty sides")
    advance = bars.stage("train tokenizer" if not cfg.tokenizer.path else "load tokenizer", 1)
    tokenizers = _get_tokenizers(cfg, [s for s, _ in pairs], [t for _, t in pairs])
    advance(1)
    seconds["tokenizer"] = time.perf_counter() - start

    start = time.perf_counter()
    advance = bars.stage("encode", total=sum(2 * len(texts[role][0]) for role in ROLES))
    encoded = {
        role: {
            side: _encode(tokenizers, texts[role][k], side, advance) for k, side in enumerate(SIDES)
        }
        for role in ROLES
    }
    seconds["encode"] = time.perf_counter() - start

    start = time.perf_counter()
    # the cache holds the texts once more (JSON lines) and their token ids (characters as an
    # estimate of bytes: no second encoding pass over the corpus)
    needed = 2 * sum(map(len, itertools.chain.from_iterable(itertools.chain(*texts.values()))))
    kept = "; no cache was written, earlier caches are intact"
    with writing(cache_path(cfg), needed, kept):
        splits, tokenizer_files, dtype = _write_cache(cfg, out, texts, encoded, tokenizers, bars)
    seconds["write"] = time.perf_counter() - start

    manifest = {
        "version": CACHE_VERSION,
        "settings": _settings(cfg),
        "inputs": source.fingerprint(),
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
    encoded: dict[str, dict[str, list[list[int]]]],
    tokenizers: Tokenizers,
    bars: Stages,
) -> tuple[dict[str, dict], list[str], type]:
    """Filter train, truncate val/test, write every split's ids and texts and the tokenizer
    into `out`; (per-split info, tokenizer file names, token dtype)."""
    vocab = max(tokenizers.src_vocab_size, tokenizers.tgt_vocab_size)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    splits: dict[str, dict] = {}
    advance = bars.stage("write cache", total=len(ROLES))
    for role in ROLES:
        src, tgt = texts[role]
        ids = encoded[role]
        info: dict[str, object] = {"lines": len(src)}
        if role == "train":
            kept, info["filtered"] = _filter_train(cfg, texts[role], ids)
            if not kept:
                raise DataError(
                    f"every train pair was filtered out ({info['filtered']}): raise "
                    f"data.max_len ({cfg.max_len}) or data.max_ratio ({cfg.max_ratio})"
                )
            ids = {side: [ids[side][i] for i in kept] for side in SIDES}
            src, tgt = [src[i] for i in kept], [tgt[i] for i in kept]
        else:
            long = sum(len(row) > cfg.max_len for side in SIDES for row in ids[side])
            if long:
                log.warning(
                    "%s: truncated %d over-long side(s) to max_len=%d", role, long, cfg.max_len
                )
            ids = {side: [row[: cfg.max_len] for row in ids[side]] for side in SIDES}
            info["truncated"] = long
        _write_split(out, role, ids, dtype)
        _write_texts(out, role, src, tgt)
        info.update(
            examples=len(src),
            src_tokens=sum(map(len, ids["src"])),
            tgt_tokens=sum(map(len, ids["tgt"])),
        )
        splits[role] = info
        advance(1)
    tokenizer_files = [p.name for p in tokenizers.save(out)]
    return splits, tokenizer_files, dtype


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


register()


@hydra.main(config_path=str(CONF_DIR), config_name="prepare", version_base="1.3")
@exit_on_error
def main(cfg: DictConfig) -> None:
    """`python -m aiayn.data.prepare data=<name> [data.key=value ...]`: build and report."""
    config = to_schema(cfg, PrepareConfig)
    set_progress(config.progress)
    path = prepare(config.data)
    print(f"data cache: {path}\n{report(load_manifest(path))}")


if __name__ == "__main__":
    main()
