"""The catalogue, part two: what a command may write over, what every reader checks, and real
faults. No command deletes or overwrites a file it did not write; every reader names the file
and what is wrong in one line; a full disk (a real tmpfs, where the test may mount one) keeps
the previous files and leaves no temporary one; a failed multirun job does not stop the
others; a refused command leaves no run directory behind. Each case runs in-process through
the command's own code path and checks the error's words and every file it must not touch."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.errors import AiaynError, CheckpointError, StorageError
from tests.helpers import REPO, cli_overrides


def fingerprint(root: Path) -> dict[str, str]:
    """Every file under `root` (names and contents): what 'intact' compares."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the shared trained run (its checkpoints, .hydra/), for a case to attack."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


@pytest.fixture(scope="module")
def exported(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("ctranslate2")
    from aiayn.export.ctranslate2 import export

    return export(ckpt, tmp_path_factory.mktemp("ct2") / "model")


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 1 MiB file system (tmpfs) at `tmp_path/disk`; skipped where mounting is not
    allowed (mount needs root or CAP_SYS_ADMIN)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'not root'}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# ---------------------------------------------------------------- export: what force=true replaces


def _export(ckpt: Path, output: Path, force: bool = True) -> Path:
    pytest.importorskip("ctranslate2")
    from aiayn.export.ctranslate2 import export

    return export(ckpt, output, force=force)


TARGETS = {  # what output_dir points at -> the words the refusal must say
    "the run's checkpoints/": ("run/checkpoints", "holds files an export does not"),
    "the run directory": ("run", "holds files an export does not"),
    "a directory of someone's files": ("mine", "holds files an export does not"),
    "a file": ("mine/notes.txt", "is a file"),
}


@pytest.mark.parametrize("case", sorted(TARGETS))
def test_export_force_replaces_only_an_earlier_export(case, run_copy, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    (mine / "aiayn.json").write_text(json.dumps({"format_version": 1}))
    target, words = TARGETS[case]
    before = fingerprint(tmp_path)
    with pytest.raises(AiaynError) as error:
        _export(run_copy / "checkpoints" / "last.ckpt", tmp_path / target)
    assert words in str(error.value) and str(tmp_path / target) in str(error.value)
    assert fingerprint(tmp_path) == before


def test_export_force_refuses_the_working_directory_and_a_foreign_metadata(
    run_copy, tmp_path, monkeypatch
):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("a user's file\n")
    monkeypatch.chdir(work)
    with pytest.raises(AiaynError, match=r"output_dir \. is not an export"):
        _export(run_copy / "checkpoints" / "last.ckpt", Path("."))
    other = tmp_path / "other"  # what looks like an export, but its metadata is broken
    other.mkdir()
    (other / "aiayn.json").write_text("{truncated")
    (other / "model.bin").write_bytes(b"someone's model")
    with pytest.raises(AiaynError, match=r"replaces only an earlier aiayn export, and .* not a"):
        _export(run_copy / "checkpoints" / "last.ckpt", other)
    assert (work / "data.txt").read_text() == "a user's file\n"
    assert (other / "model.bin").read_bytes() == b"someone's model"


def test_export_without_force_refuses_an_existing_export_and_with_it_replaces_it(
    exported, run_copy, tmp_path
):
    earlier = tmp_path / "earlier"
    shutil.copytree(exported, earlier)
    with pytest.raises(AiaynError, match=r"exists: choose a new directory, or set force=true"):
        _export(run_copy / "checkpoints" / "last.ckpt", earlier, force=False)
    replaced = _export(run_copy / "checkpoints" / "last.ckpt", earlier, force=True)
    assert json.loads((replaced / "aiayn.json").read_text())["model_sha256"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".earlier.")]  # no staging


# ------------------------------------------------------------ reading an export: each file checked


def _corrupt_metadata(directory: Path) -> str:
    (directory / "aiayn.json").write_text('{"format_version": 1, "mod')
    return "aiayn.json is not a valid aiayn.json"


def _list_metadata(directory: Path) -> str:
    (directory / "aiayn.json").write_text("[1, 2]")
    return "format_version None is not 1"


def _unknown_model_key(directory: Path) -> str:
    metadata = json.loads((directory / "aiayn.json").read_text())
    metadata["model"]["d_modle"] = 8
    (directory / "aiayn.json").write_text(json.dumps(metadata))
    return "its model settings are not aiayn's"


def _missing_model(directory: Path) -> str:
    (directory / "model.bin").unlink()
    return "model.bin is missing"


def _another_model(directory: Path) -> str:
    with open(directory / "model.bin", "ab") as file:  # another export's bytes
        file.write(b"\0")
    return "model.bin is not the model aiayn.json describes"


def _old_format(directory: Path) -> str:
    metadata = json.loads((directory / "aiayn.json").read_text())
    metadata["format_version"] = 99
    (directory / "aiayn.json").write_text(json.dumps(metadata))
    return "format_version 99 is not 1"


def _no_metadata(directory: Path) -> str:
    (directory / "aiayn.json").unlink()
    return "is not a CTranslate2 export of aiayn (no aiayn.json)"


EXPORT_FAULTS = {
    f.__name__.strip("_"): f
    for f in (
        _corrupt_metadata,
        _list_metadata,
        _unknown_model_key,
        _missing_model,
        _another_model,
        _old_format,
        _no_metadata,
    )
}


@pytest.mark.parametrize("fault", sorted(EXPORT_FAULTS))
def test_a_damaged_export_is_named_before_it_decodes(fault, exported, tmp_path):
    from aiayn.inference.ct2 import load_translator

    directory = tmp_path / "export"
    shutil.copytree(exported, directory)
    words = EXPORT_FAULTS[fault](directory)
    before = fingerprint(directory)
    with pytest.raises(CheckpointError) as error:
        load_translator(None, "cpu", engine="ctranslate2", ct2_path=str(directory))
    assert words in str(error.value), str(error.value)
    assert fingerprint(directory) == before


@pytest.mark.parametrize("occupant", ["a file", "a directory of someone's files"])
def test_the_conversion_cache_path_taken_by_something_else_is_named(occupant, run_copy):
    pytest.importorskip("ctranslate2")
    from aiayn.export.ctranslate2 import conversion_cache, file_digest
    from aiayn.inference.ct2 import load_translator

    ckpt = run_copy / "checkpoints" / "last.ckpt"
    cache = conversion_cache() / file_digest(ckpt)
    cache.parent.mkdir(parents=True, exist_ok=True)
    if occupant == "a file":
        cache.write_text("mine\n")
    else:
        cache.mkdir()
        (cache / "notes.txt").write_text("mine\n")
    before = fingerprint(run_copy), fingerprint(cache.parent)
    with pytest.raises(CheckpointError, match=rf"{cache.name}, where the CTranslate2"):
        load_translator(str(ckpt), "cpu", engine="ctranslate2")
    assert (fingerprint(run_copy), fingerprint(cache.parent)) == before
    if occupant == "a file":
        cache.unlink()
    else:
        shutil.rmtree(cache)


# ------------------------------------------------------------------ averaging: what -o may replace


def _average(*argv: str) -> None:
    from aiayn.cli.average import main

    try:
        main(list(argv))
    except SystemExit as exit:
        raise AssertionError(f"exit {exit.code}") from None


def _average_refused(capsys, *argv: str) -> str:
    from aiayn.cli.average import main

    with pytest.raises(SystemExit) as exit:
        main(list(argv))
    assert exit.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    return err


OUTPUTS = {  # -o -> the words of the refusal
    "one of its inputs": (
        "run/checkpoints/step20.ckpt",
        "is the same file as one of the checkpoints to average",
    ),
    "the run's last.ckpt": ("run/checkpoints/last.ckpt", "is a record of the run"),
    "the run's averaged.ckpt": ("run/checkpoints/averaged.ckpt", "is a record of the run"),
    "a user's file": ("notes.txt", "exists and is not an earlier average"),
    "a directory": ("run", "is a directory"),
}


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_averaging_never_overwrites_what_it_did_not_write(case, run_copy, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine\n")
    output, words = OUTPUTS[case]
    before = fingerprint(tmp_path)
    checkpoints = run_copy / "checkpoints"
    err = _average_refused(
        capsys,
        str(checkpoints / "step20.ckpt"),
        str(checkpoints / "step40.ckpt"),
        "-o",
        str(tmp_path / output),
    )
    assert words in err and str(tmp_path / output) in err
    assert fingerprint(tmp_path) == before


def test_averaging_writes_a_new_file_and_replaces_its_own_earlier_average(run_copy, tmp_path):
    checkpoints = run_copy / "checkpoints"
    inputs = [str(checkpoints / "step20.ckpt"), str(checkpoints / "step40.ckpt")]
    out = tmp_path / "avg.ckpt"
    _average(*inputs, "-o", str(out))
    first = out.read_bytes()
    _average(*inputs[1:], "-o", str(out))  # an earlier average of ours outside a run
    assert out.read_bytes() != first
    assert torch.load(out, weights_only=True)["averaged_from"] == inputs[1:]


@pytest.mark.parametrize("name", ["averaged.ckpt", "step20.ckpt"])
def test_resuming_from_weights_only_is_one_line_naming_init_from(name, run_copy, tmp_path):
    """averaged.ckpt (the callback's, weights only) and an averaged copy of a step file."""
    from aiayn.training.run import validate
    from tests.helpers import compose_train

    path = run_copy / "checkpoints" / name
    if name == "step20.ckpt":  # the same file, averaged by the CLI: weights only
        path = tmp_path / "avg.ckpt"
        _average(str(run_copy / "checkpoints" / "step20.ckpt"), "-o", str(path))
    overrides = ["model=tiny", f"ckpt_path={path}", "data.toy.train_size=1500"]
    with pytest.raises(AiaynError, match=r"without the optimizer .* init_from="):
        validate(compose_train(overrides, tmp_path / "out"))


# --------------------------------------------------------------------- translate and evaluate


@pytest.mark.parametrize("stream", ["input", "output"])
def test_translate_compares_a_redirected_stream_with_the_file_by_inode(stream, tmp_path):
    """`translate.py output=src.txt < src.txt` (and `input=out.txt > out.txt`): the
    redirected standard stream is the same file as the named one."""
    from aiayn.errors import OutputError
    from aiayn.outputs import check_output

    def same(source: str, target: str) -> bool:
        try:
            check_output(target, "output", {"input": source})
        except OutputError:
            return True
        return False

    text = tmp_path / "src.txt"
    text.write_text("hello\n")
    fd = 0 if stream == "input" else 1
    saved = os.dup(fd)
    try:
        with open(text, "rb+") as file:
            os.dup2(file.fileno(), fd)
            found = same("-", str(text)) if fd == 0 else same(str(text), "-")
            other = tmp_path / "other.txt"
            other.write_text("x\n")
            different = same("-", str(other)) if fd == 0 else same(str(other), "-")
    finally:
        os.dup2(saved, fd)
        os.close(saved)
    assert found and not different
    assert text.read_text() == "hello\n"


def test_score_mode_refuses_all_empty_references(ckpt, tmp_path):
    from aiayn.inference.evaluation import run
    from tests.helpers import compose_config

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for role in ("train", "val", "test"):
        (corpus / f"{role}.en").write_text("a b\nc d\n")
        (corpus / f"{role}.de").write_text("\n\n" if role == "test" else "e f\ng h\n")
    overrides = [f"ckpt_path={ckpt}", "mode=score", "data=files", f"data.root={corpus}"]
    with pytest.raises(AiaynError, match=r"every reference of split 'test' is empty"):
        run(compose_config("eval", overrides, tmp_path / "out"))
    assert not (tmp_path / "out" / "score.json").exists()


def test_bleu_json_names_the_export_that_produced_it(exported, tmp_path):
    from aiayn.inference.evaluation import run
    from tests.helpers import compose_config

    overrides = ["engine=ctranslate2", f"ct2_path={exported}", "progress=false"]
    result = run(compose_config("eval", overrides, tmp_path / "out"))
    written = json.loads((tmp_path / "out" / "bleu.json").read_text())
    assert written["export"] == str(exported.resolve()) == result["export"]


# ------------------------------------------------------------------ real full disks (tmpfs)


def test_a_real_full_disk_while_checkpointing_keeps_the_previous_checkpoint(small_disk):
    from aiayn.inference.checkpoint import save_atomically

    target = small_disk / "last.ckpt"
    save_atomically({"state_dict": {"w": torch.ones(3)}}, target)
    before = target.read_bytes()
    with pytest.raises(StorageError) as error:  # 4 MB of weights on a 1 MiB disk
        save_atomically({"state_dict": {"w": torch.zeros(1 << 20)}}, target)
    message = str(error.value)
    assert f"no space left writing {target}" in message and "as it was before is intact" in message
    assert target.read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["last.ckpt"]  # no temporary file


def test_a_real_full_disk_while_preparing_leaves_no_cache(small_disk, tmp_path):
    from aiayn.config import TrainConfig, to_schema
    from aiayn.data.prepare import cache_path, prepare
    from tests.helpers import compose_train, fast_overrides

    overrides = [*fast_overrides(tmp_path), f"data.cache_dir={small_disk}"]
    overrides.append("data.toy.train_size=60000")  # its files and arrays: several MiB
    data = to_schema(compose_train(overrides, tmp_path / "out"), TrainConfig).data
    with pytest.raises(StorageError, match=r"no space left writing"):
        prepare(data)
    assert not cache_path(data).exists()
    assert not [p for p in small_disk.rglob("*") if ".tmp" in p.name]


def test_a_real_full_disk_while_exporting_leaves_nothing(ckpt, small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1024 * 1024 - 16 * 1024))  # 16 KiB left: less than the model
    with pytest.raises(AiaynError, match=r"no space left writing .*model"):
        _export(ckpt, small_disk / "model")
    assert [p.name for p in small_disk.iterdir()] == ["filler"]  # no staging directory left


def test_a_real_full_disk_while_translating_is_one_line(ckpt, small_disk, tmp_path):
    from aiayn.inference.translate import run
    from tests.helpers import compose_config

    source = tmp_path / "src.txt"
    source.write_text("a b c d e f g h\n" * 20000)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1024 * 1024 - 64 * 1024))  # leave the output 64 KiB
    output = small_disk / "out.txt"
    overrides = [f"ckpt_path={ckpt}", f"input={source}", f"output={output}", "progress=false"]
    overrides += ["decode.max_len_a=0", "decode.max_len_b=8", "batch_size=512"]
    with pytest.raises(StorageError, match=rf"no space left writing {output}"):
        run(compose_config("translate", overrides, tmp_path / "out"))


# ------------------------------------------------------------ multiruns and stray run directories


def test_a_failed_multirun_job_ends_that_job_only(monkeypatch, tmp_path, capsys):
    """exit_on_error inside a multirun job: the error is that job's (FAILED in its directory,
    listed at the end), the function returns so the sweeper runs the next job, and the
    command then exits 1."""
    from aiayn import errors

    monkeypatch.setattr(errors, "FAILED_JOBS", [])
    monkeypatch.setattr(errors, "_multirun_job", lambda: ("1 (optim.lr=0)", str(tmp_path)))

    @errors.exit_on_error
    def job() -> float:
        raise errors.ConfigError("optim.lr must be > 0, got 0")

    assert job() != job()  # NaN for a sweeper's objective (optuna: a failed trial)
    assert (tmp_path / "FAILED").read_text() == "optim.lr must be > 0, got 0\n"
    with pytest.raises(SystemExit) as exit:
        errors.exit_if_jobs_failed()
    assert exit.value.code == 1
    err = capsys.readouterr().err
    assert "error: job 1 (optim.lr=0): optim.lr must be > 0" in err
    assert "2 job(s) failed" in err


@pytest.mark.slow  # a train.py multirun of three jobs
def test_a_multirun_finishes_the_other_jobs_and_exits_non_zero(tmp_path):
    from tests.helpers import cli

    args = ["-m", *cli_overrides(tmp_path), "optim.lr=1e-3,0,2e-3", "++trainer.fast_dev_run=true"]
    result = cli(args, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "error: 1 job(s) failed:" in result.stderr and "optim.lr=0" in result.stderr
    jobs = sorted((tmp_path / "logs" / "train" / "multiruns").glob("*/[0-9]"))
    assert [(job / "FAILED").exists() for job in jobs] == [False, True, False]
    assert all((job / "metrics.json").exists() for job in (jobs[0], jobs[2]))


def test_a_refused_command_leaves_no_run_directory(tmp_path):
    """A value the schema accepts but the run refuses (checked inside the job, after Hydra
    made the run directory): one line, exit 1, and the directory is gone."""
    logs = tmp_path / "logs"
    command = [sys.executable, "translate.py", f"ckpt_path={tmp_path / 'missing.ckpt'}"]
    result = subprocess.run(
        [*command, f"paths.log_dir={logs}", "input=-"],
        cwd=REPO,
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: checkpoint")
    assert not list(logs.rglob(".hydra"))  # no stray run directory anywhere under logs/


# ------------------------------------------------------------------ readers of a user's files


def _translate_case(ckpt: Path, tmp_path: Path, **settings: str) -> None:
    from aiayn.inference.translate import run
    from tests.helpers import compose_config

    overrides = [f"ckpt_path={ckpt}", "progress=false", "decode.max_len_b=4", "decode.max_len_a=0"]
    overrides += [f"{key}={value}" for key, value in settings.items()]
    run(compose_config("translate", overrides, tmp_path / "out"))


def _files(tmp_path: Path) -> dict[str, Path]:
    names = {"three": "a b\nc d\ne f\n", "one": "x\n", "utf8": "a b\n\xff\xfe\n", "tok": "{no"}
    paths = {}
    for name, text in names.items():
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_bytes(text.encode("latin-1"))
    return paths


READ_CASES = {  # settings (file names from _files) -> the words of the one line
    "a missing input": ({"input": "nope"}, "input file {nope} not found"),
    "invalid UTF-8": ({"input": "utf8"}, "{utf8}:2: not valid UTF-8"),
    "too few prefixes": ({"input": "three", "prefix_file": "one"}, "{one} has 1 lines, {three}"),
    "a broken tokenizer": ({"input": "one", "tokenizer": "tok"}, "cannot read tokenizer {tok}"),
    "an ensemble with a text file": (
        {"input": "one", "ckpt_path": "[{ckpt},{one}]"},
        "{one} is not a checkpoint",
    ),
}


@pytest.mark.parametrize("case", sorted(READ_CASES))
def test_each_file_translate_reads_is_checked_and_named(case, ckpt, tmp_path):
    paths = {**_files(tmp_path), "nope": tmp_path / "nope.txt", "ckpt": ckpt}
    settings, words = READ_CASES[case]
    given = {k: v.format(**paths) if "{" in v else str(paths[v]) for k, v in settings.items()}
    output = tmp_path / "hyp.txt"
    before = fingerprint(tmp_path)
    with pytest.raises(AiaynError) as error:
        _translate_case(ckpt, tmp_path, output=str(output), **given)
    assert words.format(**paths) in str(error.value), str(error.value)
    assert "\n" not in str(error.value)
    after = fingerprint(tmp_path)
    changed = {k for k in after.keys() | before.keys() if after.get(k) != before.get(k)}
    assert changed <= {"hyp.txt"}  # every input intact; only the output it was writing


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("+model.d_modle=8", "did you mean model.d_model?"),
        ("+data.toy.trian_size=5", "did you mean data.toy.train_size?"),
        ("+trainer.max_stepz=3", "did you mean trainer.max_steps?"),
    ],
)
def test_an_unknown_key_gets_a_did_you_mean(override, words, tmp_path):
    from aiayn.training.run import validate
    from tests.helpers import compose_train

    with pytest.raises(AiaynError, match=re.escape(words)):
        validate(compose_train([override], tmp_path / "out"))


def test_a_damaged_run_config_is_named_with_what_to_do(run_copy, tmp_path):
    from aiayn.inference.evaluation import run
    from tests.helpers import compose_config

    saved = run_copy / ".hydra" / "config.yaml"
    saved.write_text("data: [unclosed\n")
    ckpt = run_copy / "checkpoints" / "last.ckpt"
    with pytest.raises(AiaynError) as error:
        run(compose_config("eval", [f"ckpt_path={ckpt}"], tmp_path / "out"))
    assert f"{saved} (the run config of last.ckpt) cannot be read" in str(error.value)
    assert "e.g. data=multi30k" in str(error.value)
    assert saved.read_text() == "data: [unclosed\n"


def test_a_stalled_download_fails_in_bounded_time_naming_the_url(tmp_path, monkeypatch):
    """A mirror that accepts the connection and never answers: the read times out."""
    import socket
    import time

    from aiayn.data.config import DataConfig
    from aiayn.data.prepare import prepare
    from aiayn.data.sources import multi30k
    from aiayn.schema import to_schema

    monkeypatch.setattr(multi30k, "TIMEOUT_S", 1)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    with socket.socket() as listener:  # listens, accepts into its backlog, never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/raw"
        settings = {"source": "multi30k", "root": None, "test_split": "test2016"}
        settings |= {"multi30k": {"download_url": url}, "cache_dir": str(tmp_path / "cache")}
        data = to_schema(settings, DataConfig)
        start = time.monotonic()
        with pytest.raises(AiaynError) as error:
            prepare(data)
        elapsed = time.monotonic() - start
    assert url in str(error.value) and "timed out" in str(error.value)
    assert elapsed < 30  # one timeout per file, not forever
    assert not list((tmp_path / "cache").rglob("*.gz"))


@pytest.mark.parametrize(
    ("command", "override", "words"),
    [
        ("train", "model.d_modle=8", "model.d_modle: no such key; did you mean model.d_model?"),
        ("train", "sed=3", "sed: no such key; did you mean seed?"),
        ("evaluate", "decode.nbset=2", "decode.nbset: no such key; did you mean decode.nbest?"),
        ("translate", "batch_sise=8", "batch_sise: no such key; did you mean batch_size?"),
        ("export", "quantisation=int8", "quantisation: no such key; did you mean quantization?"),
        ("visualize", "sentense=hi", "sentense: no such key; did you mean sentence?"),
        ("prepare", "data.max_token=9", "data.max_token: no such key; did you mean data.max_tok"),
        # a value that is not the number the key takes (Hydra's own message spans five lines)
        ("train", "model.d_model=abc", "model.d_model=abc: model.d_model takes an integer"),
        ("train", "model.d_model=1.5", "model.d_model=1.5: model.d_model takes an integer"),
        ("train", "model.dropout=x", "model.dropout=x: model.dropout takes a number"),
        ("evaluate", "decode.beam_size=four", "decode.beam_size=four: decode.beam_size takes an"),
        (
            "train",
            "model.embedding_norm=maybe",
            "model.embedding_norm=maybe: model.embedding_norm takes true or false",
        ),
        (
            "train",
            "model.final_norm=0.5",
            "model.final_norm=0.5: model.final_norm takes true or false",
        ),
    ],
)
def test_a_mistyped_key_on_the_command_line_is_one_line_with_the_closest(
    command, override, words, monkeypatch, capsys, tmp_path
):
    """Before Hydra composes (whose own message suggests nothing): the command's main, as
    `aiayn <command>` runs it; the run directory is never made."""
    import importlib

    module = importlib.import_module(f"aiayn.cli.{command}")
    monkeypatch.setattr(sys, "argv", [command, override, f"paths.log_dir={tmp_path}"])
    with pytest.raises(SystemExit) as exit:
        module.main()
    assert exit.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {words}" or err.startswith(f"error: {words}"), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["true", "False", "YES", "off", "y", "0", "1", "-2"])
def test_every_value_omegaconf_reads_as_a_bool_passes_the_one_line_check(value):
    """The check refuses only what OmegaConf would: the values it reads as a bool, from the
    command line as Hydra parses it, pass, and the config then holds that bool."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from aiayn.config import TrainConfig
    from aiayn.model.config import ModelConfig
    from aiayn.schema import check_override_keys

    check_override_keys([f"model.embedding_norm={value}"], TrainConfig, set())
    parsed = OverridesParser.create().parse_override(f"embedding_norm={value}").value()
    model = OmegaConf.structured(ModelConfig)
    model.embedding_norm = parsed
    assert model.embedding_norm is (value.lower() in ("true", "yes", "y", "1", "-2"))


def _delete(path: Path) -> None:
    path.unlink()


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 8])  # the array's last values lost


def _garbage(path: Path) -> None:
    path.write_bytes(b"not an array")


CACHE_FAULTS = {
    "a deleted array": ("val.src.tokens.npy", _delete, "val.src.tokens.npy is damaged"),
    "a truncated array": ("train.tgt.tokens.npy", _truncate, "train.tgt.tokens.npy is damaged"),
    "a foreign file": ("test.src.offsets.npy", _garbage, "test.src.offsets.npy is damaged"),
}


@pytest.mark.parametrize("fault", sorted(CACHE_FAULTS))
def test_a_damaged_data_cache_is_named_with_what_to_do(fault, tmp_path):
    from aiayn.config import TrainConfig, to_schema
    from aiayn.data.dataset import SplitDataset
    from aiayn.data.prepare import prepare
    from tests.helpers import compose_train, fast_overrides

    overrides = [*fast_overrides(tmp_path), "data.toy.train_size=200"]
    overrides += ["data.toy.val_size=20", "data.toy.test_size=20"]
    data = to_schema(compose_train(overrides, tmp_path / "out"), TrainConfig).data
    cache = prepare(data)
    name, damage, words = CACHE_FAULTS[fault]
    damage(cache / name)
    role = name.split(".")[0]
    with pytest.raises(AiaynError) as error:
        dataset = SplitDataset(cache, role)
        dataset[0]
    assert words in str(error.value) and f"delete {cache} and run again" in str(error.value)


def test_an_ensemble_member_with_another_vocabulary_is_named(ckpt, tmp_path):
    """A checkpoint whose tokenizer is not the first member's: one line naming it, before
    anything decodes (members must share one vocabulary)."""
    from aiayn.data.tokenizer import TokenizerConfig, Tokenizers, train_tokenizer
    from aiayn.inference.ct2 import load_ensemble

    other = tmp_path / "other.ckpt"
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    texts = ["the small corpus", "of another tokenizer", "with its own merges"] * 20
    config = TokenizerConfig(vocab_size=checkpoint["hyper_parameters"]["model"]["src_vocab_size"])
    retrained = Tokenizers(
        train_tokenizer(texts, TokenizerConfig(**{**config.__dict__, "min_frequency": 1}))
    )
    checkpoint["tokenizers"] = retrained.state()
    torch.save(checkpoint, other)
    with pytest.raises(AiaynError) as error:
        load_ensemble([str(ckpt), str(other)], "cpu")
    assert str(other) in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "override",
    ["model.d_model=64,128", "model.d_model=${model.d_ff}", "model.dropout=null", "seed=-3"],
)
def test_a_sweep_an_interpolation_or_null_is_left_to_hydra(override):
    """Only a plain literal is checked against the number a key takes."""
    from aiayn.config import check_command_line
    from aiayn.training.config import TrainConfig

    check_command_line([override], TrainConfig)
