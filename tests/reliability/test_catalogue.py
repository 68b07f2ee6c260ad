"""A catalogue of hostile-but-realistic inputs, each run in-process through the code path a
command takes: a malicious checkpoint given to every command that reads checkpoints (nothing
runs), invalid configs of every command (refused by name before any work), bad corpora
(named by file and line, nothing cached). Every error is an `AiaynError`, which every CLI
prints as one `error: ...` line with exit code 1 (the last test shows that path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.errors import AiaynError
from tests.helpers import REPO, compose_config, compose_train


class _Payload:
    """Unpickling this runs `touch <marker>`: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def malicious(tmp_path: Path) -> tuple[Path, Path]:
    """(a .ckpt whose unpickling would create `marker`, marker)."""
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoints" / "evil.ckpt"
    path.parent.mkdir()
    torch.save({"state_dict": {}, "hyper_parameters": _Payload(marker)}, path)
    with open(path, "rb") as file:  # the file really carries the payload
        assert b"system" in file.read()
    return path, marker


def _train(path: Path, key: str, tmp_path: Path):
    from aiayn.training.run import validate

    return validate(compose_train(["model=tiny", f"{key}={path}"], tmp_path / "out"))


def _translate(path: Path, tmp_path: Path):
    from aiayn.inference.translate import run

    source = tmp_path / "in.txt"
    source.write_text("hello\n")
    return run(compose_config("translate", [f"ckpt_path={path}", f"input={source}"], tmp_path))


def _evaluate(path: Path, tmp_path: Path):
    from aiayn.inference.evaluation import run

    return run(compose_config("eval", [f"ckpt_path={path}", "data=toy"], tmp_path))


def _average(path: Path, tmp_path: Path):
    from aiayn.inference.averaging import average_checkpoints

    return average_checkpoints([path, path])


def _average_last(path: Path, tmp_path: Path):
    from aiayn.inference.averaging import average_checkpoints, last_checkpoints

    return average_checkpoints(last_checkpoints(path.parent, 1))


def _export(path: Path, tmp_path: Path):
    from aiayn.export.ctranslate2 import export

    pytest.importorskip("ctranslate2")
    return export(path, tmp_path / "ct2")


def _visualize(path: Path, tmp_path: Path):
    from aiayn.cli.visualize import run

    return run(compose_config("visualize", [f"ckpt_path={path}", "sentence=hi"], tmp_path))


READERS = {
    "train.py ckpt_path (resume)": lambda p, t: _train(p, "ckpt_path", t),
    "train.py init_from (fine-tune)": lambda p, t: _train(p, "init_from", t),
    "translate.py": _translate,
    "evaluate.py": _evaluate,
    "python -m aiayn.averaging a b": _average,
    "python -m aiayn.averaging --last 1 DIR": _average_last,
    "python -m aiayn.export": _export,
    "python -m aiayn.visualize": _visualize,
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_malicious_checkpoint_runs_nothing_in_any_command(reader, malicious, tmp_path):
    path, marker = malicious
    with pytest.raises(AiaynError, match=r"evil\.ckpt") as error:
        READERS[reader](path, tmp_path)
    assert "cannot read checkpoint" in str(error.value) or "not an aiayn" in str(error.value)
    assert not marker.exists()


CONFIGS = [  # (command, overrides, what the message must name)
    ("train", ["data.max_tokens=0"], "data.max_tokens"),
    ("train", ["data.tokenizer.vocab_size=3"], "data.tokenizer.vocab_size"),
    ("train", ["data.tokenizer.model=wordpiece"], "data.tokenizer.model"),
    ("train", ["data.src_lang=de"], "data.src_lang"),
    ("train", ["model.d_model=-8"], "model.d_model"),
    ("train", ["model.head_dim=0"], "model.head_dim"),
    ("train", ["model.activation_dropout=1.0"], "model.activation_dropout"),
    ("train", ["model.positional=rotary"], "model.positional"),
    ("train", ["optim.lr=0"], "optim.lr"),
    ("train", ["optim.betas=[1.0,0.9]"], "optim.betas"),
    ("train", ["optim.max_nonfinite_updates=-1"], "optim.max_nonfinite_updates"),
    ("train", ["optim.warmup_steps=-5"], "optim.warmup_steps"),
    ("train", ["optim.warmup_start_factor=2"], "optim.warmup_start_factor"),
    ("train", ["+callbacks.average.last=5"], "callbacks.average"),
    ("train", ["decode.beam_size=0"], "decode.beam_size"),
    ("train", ["+val_decode.top_p=2.0"], "val_decode.top_p"),
    ("train", ["test_ckpt=ema"], "callbacks=[default,ema]"),
    ("train", ["init_from=/no/such.ckpt"], "init_from"),
    ("train", ["trainer.accelerator=cpu", "trainer.precision=16-mixed"], "trainer.precision"),
    ("train", ["+trainer.max_stepz=3"], "max_stepz"),
    ("train", ["trainer.max_steps=many"], "trainer.max_steps='many': lightning.Trainer takes int"),
    ("train", ["trainer.gradient_clip_val=high"], "trainer.gradient_clip_val='high'"),
    ("train", ["trainer.deterministic=3"], "trainer.deterministic=3"),
    ("eval", ["ckpt_path=x.ckpt", "split=dev"], "split"),
    ("eval", ["ckpt_path=x.ckpt", "mode=rescore"], "mode"),
    ("eval", ["ckpt_path=x.ckpt", "batch_size=0"], "batch_size"),
    ("eval", ["ckpt_path=x.ckpt", "engine=onnx"], "engine"),
    ("eval", ["ckpt_path=x.ckpt", "mode=score", "engine=ctranslate2"], "mode=score"),
    ("translate", ["ckpt_path=x.ckpt", "on_long=maybe"], "on_long"),
    ("translate", ["ckpt_path=x.ckpt", "batch_size=0"], "batch_size"),
    ("translate", ["ckpt_path=x.ckpt", "engine=onnx"], "engine"),
    ("translate", ["ckpt_path=x.ckpt", "ct2_compute_type=int4"], "ct2_compute_type"),
    ("translate", ["ckpt_path=[]"], "ckpt_path is required"),
    ("translate", [], "ckpt_path is required"),
    ("export", ["ckpt_path=x.ckpt", "output_dir=o", "format=onnx"], "format"),
    ("export", ["ckpt_path=x.ckpt", "output_dir=o", "quantization=int3"], "quantization"),
]


@pytest.mark.parametrize(
    ("command", "overrides", "names"), CONFIGS, ids=[" ".join(c[1]) or c[0] for c in CONFIGS]
)
def test_an_invalid_config_is_refused_by_name_before_any_work(command, overrides, names, tmp_path):
    from aiayn.config import EvalConfig, ExportConfig, TranslateConfig, to_schema
    from aiayn.training.run import validate

    out = tmp_path / "out"
    with pytest.raises(AiaynError) as error:
        if command == "train":
            validate(compose_train(overrides, out))
        else:
            schema = {"eval": EvalConfig, "translate": TranslateConfig, "export": ExportConfig}
            to_schema(compose_config(command, overrides, out), schema[command])
    assert names in str(error.value), str(error.value)
    assert not out.exists() or not any(out.iterdir())  # nothing written


def _corpus(tmp_path: Path, files: dict[str, tuple[str, str]]) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return [
        "data=files",
        f"data.root={tmp_path}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.tokenizer.vocab_size=60",
    ]


GOOD = "a b c\nd e f\n"
CORPORA = {
    "a missing file": ({"train.en": GOOD}, "train.de"),
    "misaligned files": ({"train.en": GOOD, "train.de": "x y\n"}, "train"),
    "an empty training file": ({"train.en": "", "train.de": ""}, "train.en"),
    "invalid UTF-8": ({"train.en": GOOD, "train.de": b"ok\n\xff\xfe\n"}, "train.de, line 2"),
    "empty references": (
        {"train.en": GOOD, "train.de": GOOD, "val.de": "\n\n"},
        "every reference (target line) of the val split is empty (data.val_split=val",
    ),
}


@pytest.mark.parametrize("case", sorted(CORPORA))
def test_a_bad_corpus_is_named_by_file_and_nothing_is_cached(case, tmp_path):
    from aiayn.data.prepare import prepare

    files, names = CORPORA[case]
    splits = {"val.en": GOOD, "val.de": GOOD, "test.en": GOOD, "test.de": GOOD}
    overrides = _corpus(tmp_path, {**splits, **files})
    config = validate_data(overrides, tmp_path)
    with pytest.raises(AiaynError) as error:
        prepare(config)
    assert names in str(error.value), str(error.value)
    assert not list((tmp_path / "cache").glob("*/manifest.json"))  # no cache was left


def validate_data(overrides: list[str], tmp_path: Path):
    from aiayn.config import TrainConfig, to_schema

    return to_schema(compose_train(overrides, tmp_path / "out"), TrainConfig).data


def test_a_users_mistake_is_one_line_and_exit_code_1(tmp_path):
    """The path every CLI takes: `exit_on_error` turns an AiaynError into one line."""
    proc = subprocess.run(
        [sys.executable, "translate.py", f"ckpt_path={tmp_path / 'missing.ckpt'}", "input=-"],
        cwd=REPO,
        capture_output=True,
        text=True,
        input="hello\n",
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: checkpoint")
    assert "Traceback" not in proc.stderr and "missing.ckpt" in proc.stderr


@pytest.mark.slow  # a train.py process
def test_a_checkpoint_outside_any_run_directory_is_checked_not_a_traceback(tmp_path):
    """`train.py ckpt_path=<file>` where the file is not in a `<run>/checkpoints/` (copied out,
    or not a checkpoint at all): the resume check speaks, in one line, before any work."""
    loose = tmp_path / "copied.ckpt"
    loose.write_text("not a checkpoint\n")
    proc = subprocess.run(
        [sys.executable, "train.py", f"ckpt_path={loose}", f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "copied.ckpt" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "logs" / "train" / "runs").exists() or not any(
        (tmp_path / "logs" / "train" / "runs").glob("*/checkpoints/*")
    )


def test_hydra_full_error_still_shows_the_traceback_for_debugging(tmp_path):
    proc = subprocess.run(
        [sys.executable, "translate.py", f"ckpt_path={tmp_path / 'missing.ckpt'}", "input=-"],
        cwd=REPO,
        capture_output=True,
        text=True,
        input="hello\n",
        timeout=120,
        check=False,
        env={**os.environ, "HYDRA_FULL_ERROR": "1"},
    )
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "CheckpointError" in proc.stderr
