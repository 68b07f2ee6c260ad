"""Multi30k download: once, verified, atomic; all against a loopback HTTP server (no internet)."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aiayn.data.config import DataConfig
from aiayn.data.prepare import cache_path, load_manifest, prepare
from aiayn.data.sources import get_source
from aiayn.data.sources import multi30k as m30k
from aiayn.errors import DataError
from tests.data.conftest import small_config

LANGS = ("en", "de")
SIZES = {"train": 12, "val": 4, "test2016": 3, "test2017_mscoco": 2}
MakeCfg = Callable[..., DataConfig]


@dataclass
class Server:
    """A loopback HTTP server over `directory`; `requests` lists the paths asked for."""

    url: str
    directory: Path
    requests: list[str] = field(default_factory=list)
    raw: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (body, length)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    directory = tmp_path / "www"
    directory.mkdir()
    state = Server("", directory)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            if self.path in state.raw:  # a body shorter than its declared Content-Length
                body, length = state.raw[self.path]
                self.send_response(200)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Handler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/task1/raw"
    (directory / "task1" / "raw").mkdir(parents=True)
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def lines_of(split: str, lang: str) -> list[str]:
    word = {"en": "a dog runs", "de": "ein Hund läuft"}[lang]
    return [f"{word} {split} {i}" for i in range(SIZES[split])]


@pytest.fixture
def release(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """Gzipped small splits on the server, with their hashes in `CHECKSUMS`."""
    for split in SIZES:
        for lang in LANGS:
            name = f"{m30k.RELEASE_NAMES[split]}.{lang}"
            data = "".join(line + "\n" for line in lines_of(split, lang)).encode()
            (server.directory / "task1" / "raw" / f"{name}.gz").write_bytes(gzip.compress(data))
            monkeypatch.setitem(m30k.CHECKSUMS, name, hashlib.sha256(data).hexdigest())
    return server


@pytest.fixture
def make_cfg(tmp_path: Path, server: Server) -> MakeCfg:
    def make(**overrides: object) -> DataConfig:
        # no data.root: every split comes from the release (downloaded once)
        settings = {"source": "multi30k", "root": None, "test_split": "test2016"}
        settings["multi30k"] = {"download_url": server.url}
        return small_config(tmp_path, 100, **{**settings, **overrides})

    return make


def download_dir(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir) / "multi30k-task1"


def test_the_default_url_is_the_official_release(make_cfg: MakeCfg) -> None:
    source = get_source(make_cfg(multi30k={"download_url": None}))
    assert source.url("test2016", "de") == (
        "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
        "test_2016_flickr.de.gz"
    )
    assert source.url("test2018_flickr", "en").endswith("/task1/raw/test_2018_flickr.en.gz")


def test_downloads_once_verifies_and_reuses(
    release: Server, make_cfg: MakeCfg, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg()
    key = cache_path(cfg)  # fingerprinting downloads nothing
    assert release.requests == [] and not download_dir(cfg).exists()
    caplog.set_level("INFO", logger=m30k.__name__)
    path = prepare(cfg)
    assert path == key == cache_path(cfg)  # the same cache key before and after the download
    assert sorted(release.requests) == sorted(
        f"/task1/raw/{m30k.RELEASE_NAMES[split]}.{lang}.gz"
        for split in ("train", "val", "test2016")
        for lang in LANGS
    )
    assert sorted(p.name for p in download_dir(cfg).iterdir()) == sorted(
        f"{split}.{lang}" for split in ("train", "val", "test2016") for lang in LANGS
    )
    assert sum("downloading Multi30k" in r.getMessage() for r in caplog.records) == 6
    manifest = load_manifest(path)
    assert manifest is not None
    assert {role: info["lines"] for role, info in manifest["splits"].items()} == {
        "train": 12,
        "val": 4,
        "test": 3,
    }
    assert get_source(cfg).read("test") == (lines_of("test2016", "en"), lines_of("test2016", "de"))

    count = len(release.requests)
    assert prepare(make_cfg()) == path
    assert get_source(make_cfg()).read("train") == (
        lines_of("train", "en"),
        lines_of("train", "de"),
    )
    assert len(release.requests) == count == 6  # everything reused: no request


def test_a_further_test_split_downloads_only_its_files(release: Server, make_cfg: MakeCfg) -> None:
    cfg = make_cfg(test_split="test2017_mscoco", src_lang="de", tgt_lang="en")
    source = get_source(cfg)
    assert source.read("test") == (
        lines_of("test2017_mscoco", "de"),
        lines_of("test2017_mscoco", "en"),
    )
    assert source.files()["test"] == [
        download_dir(cfg) / "test2017_mscoco.de",
        download_dir(cfg) / "test2017_mscoco.en",
    ]
    assert "/task1/raw/test_2017_mscoco.de.gz" in release.requests
    assert not any("2016" in request for request in release.requests)


def assert_nothing_kept(cfg: DataConfig) -> None:
    """No file under a final name and no temp dir left in the download dir."""
    directory = download_dir(cfg)
    assert not directory.exists() or list(directory.iterdir()) == []


def test_a_corrupt_file_is_never_used(release: Server, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    archive = release.directory / "task1" / "raw" / "val.de.gz"
    archive.write_bytes(gzip.compress(b"tampered\n" * 4))
    expected = m30k.CHECKSUMS["val.de"]
    actual = hashlib.sha256(b"tampered\n" * 4).hexdigest()
    url = f"{release.url}/val.de.gz"
    with pytest.raises(DataError) as error:
        get_source(cfg).read("train")
    assert str(error.value) == (
        f"{url} failed its checksum: sha256 of the decompressed file is {actual}, expected "
        f"{expected}; nothing was kept. Run again, or check data.multi30k.download_url "
        f"({release.url})"
    )
    files = sorted(p.name for p in download_dir(cfg).iterdir())
    assert files == ["train.de", "train.en", "val.en"]  # the verified ones, no val.de, no temp
    with pytest.raises(DataError, match="failed its checksum"):  # never used on a later run
        prepare(cfg)
    assert not (download_dir(cfg) / "val.de").exists()


@pytest.mark.parametrize("damage", ["truncated gzip", "not gzip", "short transfer"])
def test_a_partial_or_invalid_download_is_never_used(
    release: Server, make_cfg: MakeCfg, damage: str
) -> None:
    cfg = make_cfg(train_split="val")  # the first file fetched is val.en
    archive = release.directory / "task1" / "raw" / "val.en.gz"
    data = archive.read_bytes()
    url = f"{release.url}/val.en.gz"
    if damage == "truncated gzip":
        archive.write_bytes(data[: len(data) // 2])
        message = rf"^{url} is not a valid gzip file \(.*\): a corrupt or partial download"
    elif damage == "not gzip":
        archive.write_bytes(b"<html>rate limited</html>")
        message = rf"^{url} is not a valid gzip file \(Not a gzipped file"
    else:
        release.raw["/task1/raw/val.en.gz"] = (data[:10], len(data))
        message = rf"^incomplete download of {url}: 10 of {len(data)} bytes; nothing was kept"
    with pytest.raises(DataError, match=message):
        get_source(cfg).read("train")
    assert_nothing_kept(cfg)
    assert release.requests == ["/task1/raw/val.en.gz"]


def test_offline_names_the_urls_and_where_to_put_the_files(make_cfg: MakeCfg) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}/raw"
    cfg = make_cfg(multi30k={"download_url": base})
    with pytest.raises(DataError) as error:
        prepare(cfg)
    message = str(error.value)
    assert message.startswith("cannot download Multi30k (<urlopen error [Errno 111] Connection")
    directory = download_dir(cfg)
    for split, name in (("train", "train"), ("val", "val"), ("test2016", "test_2016_flickr")):
        for lang in LANGS:
            assert f"  {base}/{name}.{lang}.gz -> {directory / f'{split}.{lang}'}\n" in message
    assert "With no data.root, these files must be fetched from:" in message
    assert f"by hand, either into {directory}/ under the names after '->'" in message
    assert "given as data.root=<dir> holding {split}.{lang} files (e.g. train.en" in message
    assert_nothing_kept(cfg)
    assert not list(Path(cfg.cache_dir).glob("multi30k-*-*"))  # no data cache either


def test_files_under_root_are_used_without_any_request(
    release: Server, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for split in ("train", "val", "test2016"):
        for lang in LANGS:
            (root / f"{split}.{lang}").write_text(f"local {split} {lang}\n", encoding="utf-8")
    cfg = make_cfg(root=str(root))
    assert get_source(cfg).read("val") == (["local val en"], ["local val de"])
    assert get_source(cfg).files()["test"] == [root / "test2016.en", root / "test2016.de"]
    assert release.requests == [] and not download_dir(cfg).exists()


def test_any_split_under_root_is_scorable(
    release: Server, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for split, lines in (("mytest", "my first\nmy second\n"), ("train", "a\n"), ("val", "b\n")):
        for lang in LANGS:
            (root / f"{split}.{lang}").write_text(f"{lines}", encoding="utf-8")
    (root / "mytest.de").write_text("mein erster\nmein zweiter\n", encoding="utf-8")
    cfg = make_cfg(test_split="mytest", root=str(root))
    source = get_source(cfg)
    assert source.read("test") == (["my first", "my second"], ["mein erster", "mein zweiter"])
    assert source.files()["test"] == [root / "mytest.en", root / "mytest.de"]
    assert release.requests == []


def test_a_split_missing_from_the_users_root_is_named_and_never_downloaded(
    release: Server, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    """No silent substitution: a user's data.root without test2016.de is an error naming that
    file, not the official test set in its place."""
    root = tmp_path / "root"
    root.mkdir()
    for split in ("train", "val", "test2016"):
        for lang in LANGS:
            (root / f"{split}.{lang}").write_text("x\n", encoding="utf-8")
    (root / "test2016.de").unlink()
    cfg = make_cfg(root=str(root))
    message = (
        rf"^Multi30k test split 'test2016': {root / 'test2016.de'} does not exist "
        rf"\(data\.root={root} must hold test2016\.en, test2016\.de\)\. Put it there, set "
        r"data\.test_split to a split under data\.root, or leave data\.root unset to download"
    )
    with pytest.raises(DataError, match=message):
        prepare(cfg)
    assert release.requests == [] and not download_dir(cfg).exists()


def test_a_split_not_in_the_release_lists_what_can_be_downloaded(
    release: Server, make_cfg: MakeCfg
) -> None:
    cfg = make_cfg(test_split="nosuch")
    message = (
        r"^Multi30k test split 'nosuch' is not in the official release, which has \['train', "
        r"'val', 'test2016', 'test2017_flickr', 'test2017_mscoco', 'test2018_flickr'\] in "
        r"languages en, de: set data\.test_split to one of those, or give data\.root=<dir> "
        r"holding nosuch\.en, nosuch\.de"
    )
    with pytest.raises(DataError, match=message):
        prepare(cfg)
    assert release.requests == []


def test_a_tampered_file_in_the_download_dir_is_refused(release: Server, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    get_source(cfg).read("val")
    (download_dir(cfg) / "val.en").write_text("edited\n", encoding="utf-8")
    count = len(release.requests)
    with pytest.raises(DataError, match=r"val\.en is not the Multi30k release file .*val\.en\.gz"):
        get_source(cfg).read("val")  # a later run: its source checks the files again
    assert len(release.requests) == count


def test_the_checksums_match_the_shared_copy(multi30k_root: Path) -> None:
    for split in ("train", "val", "test2016"):
        for lang in LANGS:
            digest = hashlib.sha256((multi30k_root / f"{split}.{lang}").read_bytes()).hexdigest()
            assert m30k.CHECKSUMS[f"{m30k.RELEASE_NAMES[split]}.{lang}"] == digest, (split, lang)
    assert len(m30k.CHECKSUMS) == 12
    names = m30k.RELEASE_NAMES.values()
    assert set(m30k.CHECKSUMS) == {f"{name}.{lang}" for name in names for lang in LANGS}


def test_reading_every_split_checks_each_downloaded_file_once(
    release: Server, make_cfg: MakeCfg, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg()
    get_source(cfg).files()  # download train/val/test2016, en and de
    hashed: list[str] = []
    real = m30k.sha256_file
    monkeypatch.setattr(m30k, "sha256_file", lambda path: hashed.append(path.name) or real(path))
    source = get_source(cfg)
    for role in ("train", "val", "test"):
        source.read(role)
    assert sorted(hashed) == sorted(
        f"{s}.{lang}" for s in ("train", "val", "test2016") for lang in LANGS
    )
