"""Corpus sources: the registry, each source's checks, reading and fingerprints."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from aiayn.config import ConfigError, to_schema
from aiayn.data import read_split
from aiayn.data.config import DataConfig
from aiayn.data.sources import SOURCES, FileSource, Source, get_source, text
from aiayn.data.sources.files import FilesSource
from aiayn.data.sources.hf import HFSource
from aiayn.data.sources.multi30k import Multi30kSource
from aiayn.data.sources.toy import TOY_VERSION, ToySource

from .conftest import SIZES, write_parallel

MakeCfg = Callable[..., DataConfig]
CONF_DATA = Path(__file__).resolve().parents[2] / "conf" / "data"


def test_registry_maps_each_name_to_a_complete_source() -> None:
    assert {
        "toy": ToySource,
        "multi30k": Multi30kSource,
        "files": FilesSource,
        "hf": HFSource,
    } == SOURCES
    for name, cls in SOURCES.items():
        assert issubclass(cls, Source) and not inspect.isabstract(cls), name
        for method in ("validate", "read", "fingerprint"):
            assert callable(getattr(cls, method)), (name, method)
        cfg = to_schema(OmegaConf.load(CONF_DATA / f"{name}.yaml"), DataConfig)
        source = get_source(cfg)
        assert type(source) is cls and source.cfg is cfg
    assert [name for name, cls in SOURCES.items() if issubclass(cls, FileSource)] == [
        "toy",
        "multi30k",
        "files",
    ]


def test_unknown_source_is_rejected_naming_the_registered_ones(files_cfg: MakeCfg) -> None:
    expected = r"DataConfig\.source must be one of \('toy', 'multi30k', 'files', 'hf'\), got 'wmt'"
    with pytest.raises(ValueError, match=expected):
        files_cfg(source="wmt")
    cfg = files_cfg()
    cfg.source = "wmt"
    with pytest.raises(ValueError, match=expected):
        get_source(cfg)
    with pytest.raises(ConfigError, match=r"^data\.source must be one of \('toy', 'multi30k'"):
        to_schema({"source": "wmt"}, DataConfig)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "hf", "hf": {"name": None}}, r"DataConfig\.hf\.name must name a dataset"),
        ({"source": "hf", "hf": {"name": "json", "data_files": "a"}}, r"hf\.data_files must map"),
        ({"source": "hf", "hf": {"name": "json", "data_files": "a"}}, r"hf\.data_files must map"),
        ({"files": {"train": ["a"], "val": ["b"]}}, r"DataConfig\.files\.test must list 2"),
        (
            {"files": {"train": ["a", "b", "c"], "val": ["b"], "test": ["c"]}},
            r"DataConfig\.files\.train must list 2 text files or 1",
        ),
        ({"source": "toy", "toy": {"val_size": 0}}, r"DataConfig\.toy\.val_size must be a"),
        (
            {"source": "toy", "src_lang": "fr"},
            r"DataConfig\.src_lang/tgt_lang must be en and de .* got \('fr', 'de'\)",
        ),
    ],
)
def test_each_source_checks_its_own_fields(
    files_cfg: MakeCfg, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        files_cfg(**overrides)


def test_a_source_checks_only_its_own_fields(files_cfg: MakeCfg) -> None:
    cfg = files_cfg(toy={"val_size": 0}, src_lang="fr", tgt_lang="en")
    assert isinstance(get_source(cfg), FilesSource) and cfg.toy.val_size == 0


def test_files_source_reads_and_fingerprints_by_content_or_by_stat(
    files_cfg: MakeCfg, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files up to `CONTENT_BYTES` are keyed by size and SHA-256; bigger ones by a stat,
    which reads nothing."""
    cfg = files_cfg()
    source = get_source(cfg)
    expected = {role: [corpus_dir / f"{role}.en", corpus_dir / f"{role}.de"] for role in SIZES}
    assert source.files() == expected
    src, tgt = read_split(cfg, "val")
    assert src == (corpus_dir / "val.en").read_text("utf-8").splitlines()
    assert tgt == (corpus_dir / "val.de").read_text("utf-8").splitlines()
    assert len(src) == SIZES["val"]
    test_de = corpus_dir / "test.de"
    stat = test_de.stat()
    digest = hashlib.sha256(test_de.read_bytes()).hexdigest()
    assert source.fingerprint()["test"][1] == [stat.st_size, digest]
    monkeypatch.setattr(text, "CONTENT_BYTES", -1)  # every file above it
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"read {self}"))
    monkeypatch.setattr(Path, "open", lambda self, *args, **kwargs: pytest.fail(f"read {self}"))
    fingerprint = source.fingerprint()
    assert sorted(fingerprint) == sorted(SIZES)
    assert fingerprint["test"][1] == [
        str(test_de.resolve()),
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
        stat.st_ino,
    ]


def test_multi30k_source_names_files_by_split_and_language(
    files_cfg: MakeCfg, tmp_path: Path
) -> None:
    root = tmp_path / "multi30k"
    root.mkdir()
    write_parallel(root, {"train": 20, "val": 5, "test2016": 7})
    cfg = files_cfg(
        source="multi30k", root=str(root), test_split="test2016", src_lang="de", tgt_lang="en"
    )
    source = get_source(cfg)
    assert source.files()["test"] == [root / "test2016.de", root / "test2016.en"]
    src, tgt = source.read("test")
    assert src == (root / "test2016.de").read_text("utf-8").splitlines() and len(tgt) == 7


def test_toy_source_fingerprint_is_its_settings_and_writes_nothing(files_cfg: MakeCfg) -> None:
    toy = {"train_size": 50, "val_size": 6, "test_size": 7, "seed": 3}
    cfg = files_cfg(source="toy", toy=toy)
    source = get_source(cfg)
    assert source.fingerprint() == {"toy": [TOY_VERSION, [50, 6, 7], 3]}
    assert not Path(cfg.cache_dir).exists()
    src, tgt = source.read("val")
    assert len(src) == len(tgt) == 6
    assert source.files()["val"][0].name == "val.en"
    assert source.files()["val"][0].parent.name == f"toy-v{TOY_VERSION}-50-6-7-seed3"


def test_hf_source_fingerprint_stats_local_files_only(files_cfg: MakeCfg, tmp_path: Path) -> None:
    local = tmp_path / "train.json"
    local.write_text("{}\n", encoding="utf-8")
    cfg = files_cfg(
        source="hf",
        hf={"name": "json", "data_files": {"train": str(local), "test": "hub/test.json"}},
        parent_field="translation",
        val_split="validation",
    )
    fingerprint = get_source(cfg).fingerprint()
    splits = {"train": "train", "val": "validation", "test": "test"}
    assert fingerprint["hf"] == ["json", None, None, splits, ("en", "de")]
    assert fingerprint["data_files"]["test"] == "hub/test.json"
    assert fingerprint["data_files"]["train"] == [3, hashlib.sha256(b"{}\n").hexdigest()]


def test_the_flat_keys_before_per_source_settings_still_work_with_a_warning(caplog, monkeypatch):
    """`data.toy_train_size`, `data.hf_name`, `data.download_url`, ... (ALIASES) apply to
    their new keys with a warning naming it; a config saved before the change (every flat
    key at its default) loads silently; outside a Hydra job (a library call), an alias that
    contradicts its new key set away from its default is refused."""
    import logging

    from hydra.core.hydra_config import HydraConfig

    from aiayn.data.config import ALIASES

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # another test's job may linger

    overrides = ["toy_train_size=300", "hf_name=json", "download_url=http://127.0.0.1:1/raw"]
    with caplog.at_level(logging.WARNING, logger="aiayn.data.config"):
        cfg = to_schema(OmegaConf.from_dotlist(overrides), DataConfig)
    assert (cfg.toy.train_size, cfg.hf.name) == (300, "json")
    assert cfg.multi30k.download_url == "http://127.0.0.1:1/raw"
    assert cfg.toy_train_size is None  # cleared: saved and logged configs carry the new keys
    warned = [r.getMessage() for r in caplog.records]
    assert "data.toy_train_size is deprecated: use data.toy.train_size (applied: 300)" in warned
    assert any("use data.multi30k.download_url" in w for w in warned) and len(warned) == 3
    caplog.clear()
    saved = {"toy_train_size": 20000, "toy_val_size": 500, "toy_test_size": 500}
    saved |= {"toy_seed": 1234, "hf_data_files": {}, "files": {}}
    with caplog.at_level(logging.WARNING, logger="aiayn.data.config"):
        assert to_schema(saved, DataConfig).toy == DataConfig().toy
    assert not caplog.records
    with pytest.raises(ConfigError, match=r"data\.toy_seed=3 \(deprecated\) and data\.toy\.seed=4"):
        to_schema({"toy_seed": 3, "toy": {"seed": 4}}, DataConfig)
    assert set(ALIASES.values()) <= {
        f"{owner}.{key}"
        for owner in ("toy", "hf", "multi30k")
        for key in asdict(getattr(DataConfig(), owner))
    }
