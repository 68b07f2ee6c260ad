"""The Multi30k source: local files under `root`, else a one-time, checksum-verified download of
the official task-1 release into `{cache_dir}/multi30k-task1/`.

Download directory layout (only the files a run needs are fetched, each once):

    {cache_dir}/multi30k-task1/{split}.{lang}   decompressed, SHA-256 verified (e.g. test2016.en)
    {cache_dir}/multi30k-task1/.tmp-*/          one download in progress (removed when it ends)

A file gets its final name only by an atomic rename after its checksum matched, so a corrupt,
partial or interrupted download is never used.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.client
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from aiayn.data.sources.base import FileSource
from aiayn.data.sources.text import file_fingerprint
from aiayn.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class Multi30kConfig:
    """`data.multi30k.*`: `download_url`, the base URL of the task-1 release that splits
    missing under `root` are downloaded from (`<download_url>/<name>.<lang>.gz`, checked
    against the release checksums, kept under `cache_dir`); None: the official release."""

    download_url: Optional[str] = None  # noqa: UP045


RELEASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
DOWNLOAD_DIR = "multi30k-task1"
TIMEOUT_S = 60  # per read: a mirror silent this long is given up
DEADLINE_S = 900  # per file, in all: a mirror that trickles bytes is given up too
CHUNK = 1 << 20

# Local split name -> the release's file name (`<name>.<lang>.gz` under the release URL).
RELEASE_NAMES = {
    "train": "train",
    "val": "val",
    "test2016": "test_2016_flickr",
    "test2017_flickr": "test_2017_flickr",
    "test2017_mscoco": "test_2017_mscoco",
    "test2018_flickr": "test_2018_flickr",
}

# SHA-256 of each release file's DECOMPRESSED content, keyed `<release name>.<lang>`.
CHECKSUMS = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2017_flickr.en": "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98",
    "test_2017_flickr.de": "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081",
    "test_2017_mscoco.en": "43051fdfa86fd5395182e718a94ca67b1b227b9f7c79596ff0f6b813216981d2",
    "test_2017_mscoco.de": "58277df3c75f92f7145a11b910b553d1cf82c439249d4dc237c899609eafac22",
    "test_2018_flickr.en": "4e585c2dd525911a6ea7730e9d0b516239af3f1b1ffae6a2130223cfb639f25e",
    "test_2018_flickr.de": "39fcc8b3331d76fb42d648d019c6898b0d5e58baac87bc2a0bb93f44ec8db207",
}


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Multi30kSource(FileSource):
    """Multi30k: line-aligned `{split}.{lang}` files, split names from
    `train_split`/`val_split`/`test_split` (the published test set is 'test2016').

    With `root` (a directory of the user's), every split is read from there, whatever its
    name (so any `<name>.en`/`<name>.de` placed there is scorable with
    `data.test_split=<name>`), and a split missing there is an error naming its file: nothing
    is substituted for it. Without `root` (the default), the splits of the official task-1
    release (`RELEASE_NAMES`: train, val, test2016, test2017_flickr, test2017_mscoco,
    test2018_flickr; en and de) are downloaded once from `download_url` (None: `RELEASE_URL`)
    into `{cache_dir}/multi30k-task1/` and checked against `CHECKSUMS`. Root files are
    fingerprinted by a `stat`, release files by their checksum, so fingerprinting downloads
    nothing and gives the same key before and after.
    """

    def validate(self) -> None:
        """Nothing to check before reading: without `root` the release is downloaded, with it
        a missing split is named when the plan is made (`_plan`)."""

    @property
    def download_dir(self) -> Path:
        """Where the release files are downloaded to (`{cache_dir}/multi30k-task1`)."""
        return Path(self.cfg.cache_dir) / DOWNLOAD_DIR

    def url(self, split: str, lang: str) -> str:
        """The release URL of `{split}.{lang}` (split a key of `RELEASE_NAMES`)."""
        base = (self.cfg.multi30k.download_url or RELEASE_URL).rstrip("/")
        return f"{base}/{RELEASE_NAMES[split]}.{lang}.gz"

    def _langs(self) -> tuple[str, str]:
        return self.cfg.src_lang, self.cfg.tgt_lang

    def _plan(self) -> dict[str, tuple[str, bool]]:
        """Role -> (split name, whether it comes from the release rather than root). Touches
        no network and no download; DataError for a split that is neither under root nor in
        the release."""
        plan = {}
        for role, split in self.cfg.split_names.items():
            files = ", ".join(f"{split}.{lang}" for lang in self._langs())
            if self.cfg.root:
                root = Path(self.cfg.root)
                missing = [f"{split}.{lang}" for lang in self._langs()]
                missing = [name for name in missing if not (root / name).is_file()]
                if missing:
                    raise DataError(
                        f"Multi30k {role} split {split!r}: {root / missing[0]} does not exist "
                        f"(data.root={root} must hold {files}). Put it there, set "
                        f"data.{role}_split to a split under data.root, or leave data.root "
                        "unset to download the official release"
                    )
                plan[role] = (split, False)
            elif split in RELEASE_NAMES and all(
                f"{RELEASE_NAMES[split]}.{lang}" in CHECKSUMS for lang in self._langs()
            ):
                plan[role] = (split, True)
            else:
                raise DataError(
                    f"Multi30k {role} split {split!r} is not in the official release, which "
                    f"has {list(RELEASE_NAMES)} in languages en, de: set data.{role}_split to "
                    f"one of those, or give data.root=<dir> holding {files}"
                )
        return plan

    def files(self) -> dict[str, list[Path]]:
        """Role -> [src, tgt] files; downloads (once) the release files a run needs that are
        not yet in the download dir, and checks those already there against `CHECKSUMS`
        (once per source object: reading three splits hashes each file once)."""
        return self._resolved_files

    @functools.cached_property
    def _resolved_files(self) -> dict[str, list[Path]]:
        root, langs, plan = Path(self.cfg.root or "."), self._langs(), self._plan()
        release = [
            (split, lang) for split, from_release in plan.values() if from_release for lang in langs
        ]
        release = list(dict.fromkeys(release))  # val_split may equal test_split
        missing = [
            (s, lang) for s, lang in release if not (self.download_dir / f"{s}.{lang}").is_file()
        ]
        for split, lang in release:
            if (split, lang) not in missing:
                self._verify_existing(split, lang)
        for number, (split, lang) in enumerate(missing):
            self._download(split, lang, missing[number:])
        return {
            role: [
                (self.download_dir if from_release else root) / f"{split}.{lang}" for lang in langs
            ]
            for role, (split, from_release) in plan.items()
        }

    def fingerprint(self) -> dict[str, object]:
        result: dict[str, object] = {}
        for role, (split, release) in self._plan().items():
            if release:
                names = [f"{RELEASE_NAMES[split]}.{lang}" for lang in self._langs()]
                result[role] = [[DOWNLOAD_DIR, name, CHECKSUMS[name]] for name in names]
            else:
                root = Path(self.cfg.root or "")
                result[role] = [
                    file_fingerprint(root / f"{split}.{lang}") for lang in self._langs()
                ]
        return result

    def _verify_existing(self, split: str, lang: str) -> None:
        path = self.download_dir / f"{split}.{lang}"
        expected = CHECKSUMS[f"{RELEASE_NAMES[split]}.{lang}"]
        actual = sha256_file(path)
        if actual != expected:
            raise DataError(
                f"{path} is not the Multi30k release file {self.url(split, lang)}: sha256 "
                f"{actual}, expected {expected}. Delete it to download it again, or put your "
                f"own files under data.root"
            )

    def _download(self, split: str, lang: str, missing: list[tuple[str, str]]) -> None:
        """Download, decompress and verify `{split}.{lang}`, then rename it into place; on any
        failure nothing is left under the final name and the temp dir is removed."""
        url, final = self.url(split, lang), self.download_dir / f"{split}.{lang}"
        expected = CHECKSUMS[f"{RELEASE_NAMES[split]}.{lang}"]
        final.parent.mkdir(parents=True, exist_ok=True)
        log.info("downloading Multi30k %s from %s", final, url)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            archive = tmp / f"{final.name}.gz"
            with _Deadline(url) as deadline:
                try:
                    with deadline.opener.open(url, timeout=TIMEOUT_S) as response:
                        declared = response.headers.get("Content-Length")
                        with archive.open("wb") as out:
                            while block := response.read1(CHUNK):
                                out.write(block)
                except (OSError, http.client.HTTPException) as error:  # URLError, timeouts
                    deadline.check()
                    raise DataError(self._offline_message(error, missing)) from error
                deadline.check()
            size = archive.stat().st_size
            if declared is not None and declared.isdigit() and size != int(declared):
                raise DataError(
                    f"incomplete download of {url}: {size} of {declared} bytes; nothing was "
                    f"kept, run again"
                )
            text, digest = tmp / final.name, hashlib.sha256()
            try:
                with gzip.open(archive) as source, text.open("wb") as out:
                    for chunk in iter(lambda: source.read(CHUNK), b""):
                        digest.update(chunk)
                        out.write(chunk)
            except (OSError, EOFError, zlib.error) as error:
                raise DataError(
                    f"{url} is not a valid gzip file ({error}): a corrupt or partial download; "
                    f"nothing was kept, run again"
                ) from error
            if digest.hexdigest() != expected:
                raise DataError(
                    f"{url} failed its checksum: sha256 of the decompressed file is "
                    f"{digest.hexdigest()}, expected {expected}; nothing was kept. Run again, "
                    "or check data.multi30k.download_url "
                    f"({self.cfg.multi30k.download_url or RELEASE_URL})"
                )
            os.replace(text, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("verified Multi30k %s (sha256 %s)", final, expected)

    def _offline_message(self, error: BaseException, missing: list[tuple[str, str]]) -> str:
        lines = "\n".join(
            f"  {self.url(split, lang)} -> {self.download_dir / f'{split}.{lang}'}"
            for split, lang in missing
        )
        return (
            f"cannot download Multi30k ({error}). With no data.root, these files "
            f"must be fetched from:\n{lines}\n"
            f"Without network, download and gunzip them by hand, either into "
            f"{self.download_dir}/ under the names after '->' (they are checked against the "
            f"release checksums), or into a directory of your own given as data.root=<dir> "
            f"holding {{split}}.{{lang}} files (e.g. train.en, train.de, val.en, val.de, "
            f"test2016.en, test2016.de)"
        )


class _Deadline:
    """`DEADLINE_S` for a whole download, name lookup, connection, TLS handshake, headers and
    body (`TIMEOUT_S` bounds each read alone). The name is looked up on a thread waited for
    only as long as is left; each connection's socket is watched from the moment it exists
    (a duplicate of it, which outlives TLS wrapping) and shut down once the deadline has
    passed, which ends a read or a handshake that waits on it. So a mirror that trickles its
    handshake, headers or body, or a resolver that hangs, cannot hold a download longer.
    `check()` raises the DataError once it has passed."""

    def __init__(self, url: str) -> None:
        self.url, self.expired, self.sockets = url, False, []
        self.opener = urllib.request.build_opener(_Handler(self))
        self._end = time.monotonic() + DEADLINE_S
        self._timer = threading.Timer(DEADLINE_S, self._expire)
        self._timer.daemon = True
        self._lock = threading.Lock()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self.sockets:
                self.cut(sock)

    def left(self) -> float:
        """Seconds left; the DataError once there are none."""
        self.check()
        return self._end - time.monotonic()

    def connect(
        self, address: tuple[str, int], timeout: Any = None, source_address: Any = None
    ) -> socket.socket:
        """`socket.create_connection` within the deadline: the lookup on a thread, each
        address tried with at most the time left, the socket watched before it is returned."""
        found: list[Any] = []
        lookup = threading.Thread(
            target=lambda: found.append(_lookup(*address)), daemon=True, name="aiayn-dns"
        )
        lookup.start()
        lookup.join(self.left())
        if not found:  # still looking: the deadline has passed
            self._expire()
            self.check()
        if isinstance(found[0], OSError):
            raise found[0]
        error: OSError = OSError(f"no address for {address[0]}")
        for *_, sockaddr in found[0]:
            limit = self.left()
            if isinstance(timeout, (int, float)):  # else http.client's "no timeout given"
                limit = min(timeout, limit)
            try:
                sock = socket.create_connection(sockaddr[:2], limit, source_address)
            except OSError as failed:
                error = failed
                continue
            self.watch(sock.dup())
            return sock
        raise error

    def watch(self, sock: socket.socket) -> None:
        """A socket of this download, cut at once where the deadline has passed already (a
        redirect's connection opened as the timer fired)."""
        with self._lock:
            self.sockets.append(sock)
            if self.expired:
                self.cut(sock)

    @staticmethod
    def cut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def check(self) -> None:
        """The DataError once the deadline has passed (by the clock: a read that timed out
        as it passed may end before the timer fires)."""
        if self.expired or time.monotonic() >= self._end:
            raise DataError(
                f"downloading {self.url} timed out: not done after {DEADLINE_S} s in all (a "
                "slow or stalled mirror); nothing was kept. Run again, or download the files "
                "by hand (see data.root)"
            )

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        for sock in self.sockets:
            sock.close()


def _lookup(host: str, port: int) -> list[Any] | OSError:
    """`socket.getaddrinfo` for a TCP connection, or the error it raised."""
    try:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except OSError as error:
        return error


class _Handler(urllib.request.HTTPSHandler, urllib.request.HTTPHandler):
    """urllib's HTTP and HTTPS handlers, whose connections `deadline` makes and watches."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_Watched, self.deadline), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        watched = functools.partial(_WatchedTLS, self.deadline)
        return self.do_open(watched, req, context=self._context)


class _Watch:
    """A connection that `deadline` opens (`_create_connection`: http.client's hook)."""

    def __init__(self, deadline: _Deadline, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = deadline.connect


class _Watched(_Watch, http.client.HTTPConnection):
    pass


class _WatchedTLS(_Watch, http.client.HTTPSConnection):
    pass
