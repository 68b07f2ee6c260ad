"""The catalogue, part three: every output against every input and every file a run or an
export owns; every argument in its range; exports checked without a digest; bounded time and
memory. Each case runs in-process through the command's own code path and checks the error's
words (naming the argument or file and what to do) and every file's bytes before and after."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from aiayn.errors import AiaynError, CheckpointError, ConfigError, OutputError
from tests.helpers import compose_config
from tests.reliability.test_user_files import exported, fingerprint, run_copy

__all__ = ["exported", "run_copy"]  # fixtures shared with part two


def _state(*roots: Path) -> dict[str, dict[str, str]]:
    """Every file under each root (what 'intact' compares)."""
    return {str(root): fingerprint(root) for root in roots}


def _one_line(capsys: pytest.CaptureFixture[str], exit: pytest.ExceptionInfo) -> str:
    assert exit.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    return err


# ------------------------------------------------------- translate: what output= must not be


def _user_files(tmp_path: Path, run: Path) -> dict[str, Path]:
    """A user's input, prefix file, tokenizer, a hard-linked file and links of each kind."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "in.txt").write_text("a b\nc d\n")
    (files / "prefixes.txt").write_text("x\n\n")
    (files / "notes.txt").write_text("a user's notes\n")
    (files / "notes-link.txt").hardlink_to(files / "notes.txt")
    ckpt = run / "checkpoints" / "last.ckpt"
    (files / "ckpt-hardlink.ckpt").hardlink_to(ckpt)
    (files / "in-hardlink.txt").hardlink_to(files / "in.txt")
    (files / "to-ckpt").symlink_to(ckpt)
    (files / "chain-1").symlink_to(files / "to-ckpt")
    (files / "chain-2").symlink_to(files / "chain-1")
    (files / "dangling").symlink_to(files / "nowhere.txt")
    (files / "linked-dir").symlink_to(files)
    shutil.copy(ckpt, files / "copy.ckpt")
    (files / "tokenizer.json").write_text('{"a user\'s": "tokenizer"}\n')  # refused unread
    return {"files": files, "run": run, "ckpt": ckpt}


TRANSLATE_OUTPUTS = {  # output= (under {files}/{run}) -> the words of the refusal
    "its own checkpoint": ("{ckpt}", "is the same file as ckpt_path"),
    "a hard link of its checkpoint": (
        "{files}/ckpt-hardlink.ckpt",
        "is the same file as ckpt_path",
    ),
    "a symlink to its checkpoint": ("{files}/to-ckpt", "is a symbolic link"),
    "a symlink chain to its checkpoint": ("{files}/chain-2", "is a symbolic link"),
    "a dangling symlink": ("{files}/dangling", "is a symbolic link"),
    "its prefix file": ("{files}/prefixes.txt", "is the same file as prefix_file"),
    "its input through a linked directory": (
        "{files}/linked-dir/in.txt",
        "is the same file as input",
    ),
    "a hard link of its input": ("{files}/in-hardlink.txt", "is the same file as input"),
    "its tokenizer file": ("{files}/tokenizer.json", "is the same file as tokenizer"),
    "the run's .hydra/config.yaml": ("{run}/.hydra/config.yaml", "is a record of the run"),
    "the run's metrics.json": ("{run}/metrics.json", "is a record of the run"),
    "the run's csv/metrics.csv": ("{run}/csv/metrics.csv", "is a record of the run"),
    "another checkpoint of the run": ("{run}/checkpoints/step20.ckpt", "is a record of the run"),
    "a checkpoint outside any run": ("{files}/copy.ckpt", "is a checkpoint"),
    "a directory": ("{files}", "is a directory"),
    "a file with another hard link": ("{files}/notes.txt", "other hard link(s)"),
}


@pytest.mark.parametrize("case", sorted(TRANSLATE_OUTPUTS))
def test_translate_never_writes_over_an_input_or_a_record(case, run_copy, tmp_path):
    from aiayn.inference.translate import run

    paths = _user_files(tmp_path, run_copy)
    output, words = TRANSLATE_OUTPUTS[case]
    output = output.format(**paths)
    settings = [f"input={paths['files'] / 'in.txt'}", f"output={output}", "progress=false"]
    settings += [f"prefix_file={paths['files'] / 'prefixes.txt'}", f"ckpt_path={paths['ckpt']}"]
    if "tokenizer" in case:
        settings.append(f"tokenizer={paths['files'] / 'tokenizer.json'}")
    before = _state(paths["files"], run_copy)
    with pytest.raises(OutputError) as error:
        run(compose_config("translate", settings, tmp_path / "out"))
    message = str(error.value)
    assert words in message and f"output {output}" in message, message
    assert "choose another output" in message or "remove the link" in message or "name a" in message
    assert "\n" not in message
    assert _state(paths["files"], run_copy) == before


def test_translate_never_writes_over_its_exports_model(exported, tmp_path):
    from aiayn.inference.translate import run

    export = tmp_path / "export"
    shutil.copytree(exported, export)
    (tmp_path / "in.txt").write_text("a b\n")
    for name in ("model.bin", "aiayn.json", "tokenizer.json"):
        settings = ["engine=ctranslate2", f"ct2_path={export}", f"input={tmp_path / 'in.txt'}"]
        before = fingerprint(tmp_path)
        with pytest.raises(OutputError, match=r"is the same file as a file of ct2_path"):
            run(compose_config("translate", [*settings, f"output={export / name}"], tmp_path))
        assert fingerprint(tmp_path) == before


def test_translate_never_writes_over_another_exports_files(exported, ckpt, tmp_path):
    """engine=torch: the export is no input, but its files are still not an output's."""
    from aiayn.inference.translate import run

    export = tmp_path / "export"
    shutil.copytree(exported, export)
    (tmp_path / "in.txt").write_text("a b\n")
    before = fingerprint(tmp_path)
    settings = [f"ckpt_path={ckpt}", f"input={tmp_path / 'in.txt'}"]
    with pytest.raises(OutputError, match=r"is a file of the CTranslate2 export"):
        run(compose_config("translate", [*settings, f"output={export / 'aiayn.json'}"], tmp_path))
    assert fingerprint(tmp_path) == before


# ------------------------------------------------------------ evaluate: its two output files


EVALUATE_OUTPUTS = {  # file in paths.output_dir -> (how it is planted, the refusal's words)
    "bleu.json a symlink to the checkpoint": ("bleu.json", "symlink", "is a symbolic link"),
    "the hypotheses a hard link of the checkpoint": (
        "hypotheses.test.txt",
        "hardlink",
        "is the same file as ckpt_path",
    ),
    "bleu.json a hard link of a user's file": ("bleu.json", "user", "other hard link(s)"),
}


@pytest.mark.parametrize("case", sorted(EVALUATE_OUTPUTS))
def test_evaluate_never_writes_through_its_output_files(case, run_copy, tmp_path):
    from aiayn.inference.evaluation import run

    name, plant, words = EVALUATE_OUTPUTS[case]
    out = tmp_path / "out"
    out.mkdir()
    ckpt = run_copy / "checkpoints" / "last.ckpt"
    (tmp_path / "notes.txt").write_text("mine\n")
    link = out / name
    if plant == "symlink":
        link.symlink_to(ckpt)
    elif plant == "hardlink":
        link.hardlink_to(ckpt)
    else:
        link.hardlink_to(tmp_path / "notes.txt")
    before = _state(tmp_path)
    with pytest.raises(OutputError) as error:
        run(compose_config("eval", [f"ckpt_path={ckpt}", "progress=false"], out))
    assert words in str(error.value) and str(link) in str(error.value)
    assert _state(tmp_path) == before


def test_evaluate_never_writes_over_a_file_of_the_corpus(run_copy, tmp_path):
    """A corpus whose test references sit where evaluate writes its hypotheses (its output
    directory given as the corpus's): refused before anything is decoded or written."""
    from aiayn.inference.evaluation import run

    out = tmp_path / "corpus"
    out.mkdir()
    (out / "test.en").write_text("a dog runs .\n")
    (out / "hypotheses.test.txt").write_text("ein hund läuft .\n")  # the references
    before = _state(tmp_path)
    files = [f"data.files.test=[{out / 'test.en'},{out / 'hypotheses.test.txt'}]"]
    overrides = [f"ckpt_path={run_copy / 'checkpoints' / 'last.ckpt'}", "progress=false"]
    overrides += ["data=files", *files]
    with pytest.raises(OutputError) as error:
        run(compose_config("eval", overrides, out))
    assert "is the same file as a file of the corpus" in str(error.value)
    assert _state(tmp_path) == before


# ------------------------------------------------------------------ curves -o and average -o


CURVES_OUTPUTS = {  # -o (under {run}/{tmp}) -> the refusal's words
    "a symlink into best.ckpt": ("{tmp}/curves.png", "is a symbolic link"),
    "the run's csv/metrics.csv": ("{run}/csv/metrics.csv", "is the same file as a run's"),
    "the run's last.ckpt": ("{run}/checkpoints/last.ckpt", "is a record of the run"),
    "a directory": ("{tmp}", "is a directory"),
    "a hard-linked picture": ("{tmp}/shared.png", "other hard link(s)"),
}


@pytest.mark.parametrize("case", sorted(CURVES_OUTPUTS))
def test_curves_never_writes_through_a_link_or_over_a_record(case, run_copy, tmp_path, capsys):
    from aiayn.cli.curves import main

    (tmp_path / "curves.png").symlink_to(run_copy / "checkpoints" / "last.ckpt")
    (tmp_path / "picture.png").write_bytes(b"a user's picture")
    (tmp_path / "shared.png").hardlink_to(tmp_path / "picture.png")
    output, words = CURVES_OUTPUTS[case]
    output = output.format(run=run_copy, tmp=tmp_path)
    before = _state(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main([str(run_copy), "-o", output])
    err = _one_line(capsys, exit)
    assert words in err and f"-o {output}" in err, err
    assert _state(tmp_path) == before


@pytest.mark.parametrize("last", ["0", "-1", "-5"])
def test_average_last_below_one_is_refused_by_name(last, run_copy, tmp_path, capsys):
    from aiayn.cli.average import main

    before = _state(tmp_path)
    out = tmp_path / "avg.ckpt"
    with pytest.raises(SystemExit) as exit:
        main(["--last", last, str(run_copy / "checkpoints"), "-o", str(out)])
    err = _one_line(capsys, exit)
    assert "--last must be at least 1" in err and f"got {last}" in err
    assert _state(tmp_path) == before and not out.exists()


AVERAGE_OUTPUTS = {  # -o -> (how it is planted, the refusal's words)
    "a symlink to a user's file": ("symlink", "is a symbolic link"),
    "a hard link of an input": ("hardlink", "is the same file as one of the checkpoints"),
}


@pytest.mark.parametrize("case", sorted(AVERAGE_OUTPUTS))
def test_average_never_writes_through_a_link(case, run_copy, tmp_path, capsys):
    from aiayn.cli.average import main

    plant, words = AVERAGE_OUTPUTS[case]
    step20 = run_copy / "checkpoints" / "step20.ckpt"
    (tmp_path / "notes.txt").write_text("mine\n")
    out = tmp_path / "avg.ckpt"
    if plant == "symlink":
        out.symlink_to(tmp_path / "notes.txt")
    else:
        out.hardlink_to(step20)
    before = _state(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main([str(step20), str(run_copy / "checkpoints" / "step40.ckpt"), "-o", str(out)])
    err = _one_line(capsys, exit)
    assert words in err and str(out) in err, err
    assert _state(tmp_path) == before


class _Payload:
    """An object `weights_only=True` refuses to unpickle."""


SNAPSHOTS = {  # a snapshot's bytes -> the refusal's words
    "a pickled object": (lambda p: torch.save({"w": _Payload()}, p), "cannot read checkpoint"),
    "a text file": (lambda p: p.write_text("not a snapshot\n"), "is not a checkpoint"),
    "a list of numbers": (lambda p: torch.save([1, 2], p), "is not a snapshot of weights"),
}


@pytest.mark.parametrize("case", sorted(SNAPSHOTS))
def test_a_crafted_averaging_snapshot_is_one_line(case, tmp_path):
    from aiayn.callbacks.averaging import _snapshot_state

    path = tmp_path / ".snapshot-step20.pt"
    write, words = SNAPSHOTS[case]
    write(path)
    before = fingerprint(tmp_path)
    with pytest.raises(CheckpointError) as error:
        _snapshot_state(path)
    message = str(error.value)
    assert words in message and str(path) in message and "delete it" in message
    assert "\n" not in message
    assert fingerprint(tmp_path) == before


# ------------------------------------------------------------------- arguments in their range


DECODE_ARGUMENTS = {  # override -> the refusal's words
    "decode.beam_size=0": "decode.beam_size must be a positive integer, got 0",
    "decode.beam_size=-3": "decode.beam_size must be a positive integer, got -3",
    "decode.nbest=0": "decode.nbest must be a positive integer, got 0",
    "decode.top_p=1.5": "decode.top_p must lie in (0, 1], got 1.5",
    "decode.top_p=0": "decode.top_p must lie in (0, 1], got 0.0",
    "decode.temperature=0": "decode.temperature must be a finite number > 0, got 0.0",
    "decode.top_k=-1": "decode.top_k must be an integer >= 0, got -1",
    "decode.length_penalty=-1": "decode.length_penalty must be a finite number >= 0, got -1.0",
    "decode.max_len_a=-2": "decode.max_len_a must be a finite number >= 0, got -2.0",
}


@pytest.mark.parametrize("command", ["translate", "eval"])
@pytest.mark.parametrize("override", sorted(DECODE_ARGUMENTS))
def test_a_decode_argument_out_of_range_is_refused_before_any_work(command, override, tmp_path):
    from aiayn.inference.config import EvalConfig, TranslateConfig
    from aiayn.schema import to_schema

    schema = TranslateConfig if command == "translate" else EvalConfig
    missing = tmp_path / "never-read.ckpt"  # refused before the checkpoint is looked at
    cfg = compose_config(command, [f"ckpt_path={missing}", override], tmp_path / "out")
    with pytest.raises(ConfigError) as error:
        to_schema(cfg, schema)
    assert DECODE_ARGUMENTS[override] in str(error.value)
    assert not (tmp_path / "out").exists()


def _no_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")


@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
@pytest.mark.parametrize("command", ["translate", "eval"])
def test_cuda_without_cuda_is_one_line(command, device, ckpt, tmp_path):
    from aiayn.inference.evaluation import run as evaluate
    from aiayn.inference.translate import run as translate

    _no_cuda()
    (tmp_path / "in.txt").write_text("a b\n")
    settings = [f"ckpt_path={ckpt}", f"device={device}", "progress=false"]
    if command == "translate":
        settings.append(f"input={tmp_path / 'in.txt'}")
    with pytest.raises(ConfigError) as error:
        (translate if command == "translate" else evaluate)(
            compose_config(command, settings, tmp_path / "out")
        )
    message = str(error.value)
    assert f"device={device!r}" in message and "no CUDA device" in message
    assert "use device=cpu" in message and "\n" not in message


def test_cuda_without_cuda_in_the_ctranslate2_engine_is_one_line(exported):
    from aiayn.export.ctranslate2 import ctranslate2_module
    from aiayn.inference.ct2 import load_translator

    if ctranslate2_module().get_cuda_device_count():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ConfigError, match=r"device='cuda', but this machine has no CUDA device"):
        load_translator(None, "cuda", engine="ctranslate2", ct2_path=str(exported))


def test_a_device_that_is_none_is_named(ckpt):
    from aiayn.inference.checkpoint import resolve_device

    with pytest.raises(ConfigError, match=r"device='tpu' is not a device: use cpu, cuda"):
        resolve_device("tpu")


ALIASES = {  # deprecated data keys -> (where the value goes, the value)
    "data.hf_data_files={train: a.jsonl}": ("hf", "data_files", {"train": "a.jsonl"}),
    "data.toy_train_size=123": ("toy", "train_size", 123),
    "data.download_url=http://127.0.0.1:9/raw": (
        "multi30k",
        "download_url",
        "http://127.0.0.1:9/raw",
    ),
}


@pytest.mark.parametrize("override", sorted(ALIASES))
def test_a_deprecated_data_key_still_works(override, tmp_path):
    from aiayn.config import TrainConfig
    from aiayn.schema import to_schema
    from tests.helpers import compose_train

    group = ["data=hf"] if "hf_" in override else []
    data = to_schema(compose_train([*group, override], tmp_path / "out"), TrainConfig).data
    owner, key, value = ALIASES[override]
    assert getattr(getattr(data, owner), key) == value


def test_a_deprecated_key_overrides_its_preset_and_is_refused_only_beside_its_new_key(tmp_path):
    """`data=hf data.hf_name=json` trains on `json`, as before the new keys (the preset's
    `hf.name: wmt14` gives way, with a warning); giving `data.hf.name` on the command line too,
    with another value, is refused naming the new key."""
    from aiayn.config import TrainConfig
    from aiayn.schema import to_schema
    from tests.helpers import compose_train

    cfg = compose_train(["data=hf", "data.hf_name=json"], tmp_path / "out")
    assert to_schema(cfg, TrainConfig).data.hf.name == "json"
    cfg = compose_train(["data=hf", "data.hf.name=json", "data.hf_name=json"], tmp_path / "o")
    assert to_schema(cfg, TrainConfig).data.hf.name == "json"
    cfg = compose_train(["data=hf", "data.hf.name=text", "data.hf_name=json"], tmp_path / "o")
    with pytest.raises(ConfigError) as error:
        to_schema(cfg, TrainConfig)
    assert "give data.hf.name='json' instead of data.hf_name" in str(error.value)


# ------------------------------------------------------------ exports checked without a digest


def _undigested(exported: Path, tmp_path: Path, **model: int) -> Path:
    """A copy of the export without `model_sha256`, its model settings changed by `model`."""
    directory = tmp_path / "export"
    shutil.copytree(exported, directory)
    metadata = json.loads((directory / "aiayn.json").read_text())
    del metadata["model_sha256"]
    metadata["model"].update(model)
    (directory / "aiayn.json").write_text(json.dumps(metadata))
    return directory


SETTINGS = {  # aiayn.json's model settings -> values its model.bin does not have
    "d_ff": {"d_ff": 256},
    "num_encoder_layers": {"num_encoder_layers": 3},
    "num_decoder_layers": {"num_decoder_layers": 1},
    "num_heads": {"num_heads": 8},
    "max_positions": {"max_positions": 512},
    "src_vocab_size": {"src_vocab_size": 900, "tgt_vocab_size": 900},  # shared embeddings
}


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_an_export_without_a_digest_is_checked_against_its_weights(key, exported, tmp_path):
    from aiayn.inference.ct2 import load_translator

    directory = _undigested(exported, tmp_path, **SETTINGS[key])
    before = fingerprint(directory)
    with pytest.raises(CheckpointError) as error:
        load_translator(None, "cpu", engine="ctranslate2", ct2_path=str(directory))
    message = str(error.value)
    assert f"model.bin does not fit aiayn.json: it holds {key}" in message, message
    assert f"aiayn.json says {SETTINGS[key][key]}" in message
    assert "export the checkpoint again" in message
    assert fingerprint(directory) == before


def _swap_two_tokens(directory: Path) -> None:
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))


def _drop_a_token(directory: Path) -> None:
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    del vocab[last]
    tokenizer["model"]["merges"] = [
        m
        for m in tokenizer["model"]["merges"]
        if "".join(m if isinstance(m, list) else m.split()) != last
    ]
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))


def _truncate_model(directory: Path) -> None:
    data = (directory / "model.bin").read_bytes()
    (directory / "model.bin").write_bytes(data[:40])


TOKENIZER_FAULTS = {
    "another tokenizer of the same size": (_swap_two_tokens, "tokens are not the vocabulary"),
    "a tokenizer one token short": (_drop_a_token, "tokens but the model"),
    "a truncated model.bin": (_truncate_model, "is not a CTranslate2 model"),
}


@pytest.mark.parametrize("fault", sorted(TOKENIZER_FAULTS))
def test_an_export_without_a_digest_is_checked_against_its_tokenizer(fault, exported, tmp_path):
    from aiayn.inference.ct2 import load_translator

    directory = _undigested(exported, tmp_path)
    damage, words = TOKENIZER_FAULTS[fault]
    damage(directory)
    before = fingerprint(directory)
    with pytest.raises(CheckpointError) as error:
        load_translator(None, "cpu", engine="ctranslate2", ct2_path=str(directory))
    assert words in str(error.value) and "export the checkpoint again" in str(error.value)
    assert fingerprint(directory) == before


def test_an_intact_export_without_a_digest_still_decodes(exported, tmp_path):
    from aiayn.inference.ct2 import load_translator

    directory = _undigested(exported, tmp_path)
    translator = load_translator(None, "cpu", engine="ctranslate2", ct2_path=str(directory))
    assert len(translator.translate_all(["a b"], 4, "test")) == 1


def test_concurrent_builds_of_one_conversion_cache_all_succeed(run_copy, monkeypatch):
    """Three decoders at once on a checkpoint not yet converted: each builds in its own
    directory (all three held until each has written its model, so that they race to put it
    in place); the first rename wins and the others use its conversion. Nothing is written
    into the run."""
    pytest.importorskip("ctranslate2")
    from aiayn.export import ctranslate2
    from aiayn.export.ctranslate2 import cached_export, file_digest, read_metadata

    together = threading.Barrier(3, timeout=30)
    save_spec = ctranslate2.save_spec

    def save_then_wait(*args: object, **kwargs: object) -> None:
        save_spec(*args, **kwargs)
        together.wait()

    monkeypatch.setattr(ctranslate2, "save_spec", save_then_wait)

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(run_copy.parent / "cache"))
    ckpt = run_copy / "checkpoints" / "last.ckpt"
    before = fingerprint(run_copy)
    results: list[object] = []

    def build() -> None:
        try:
            results.append(cached_export(ckpt))
        except Exception as error:
            results.append(error)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cache = run_copy.parent / "cache" / "ct2" / file_digest(ckpt)
    assert results == [cache] * 3, results
    assert read_metadata(cache)["model_sha256"]
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # no staging left
    assert fingerprint(run_copy) == before


# ------------------------------------------------------------------ bounded time and memory


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Promises a body and sends one byte of it at a time, a while apart."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.05)

    def log_message(self, *args: object) -> None:
        pass


class _TrickleHeaders(_Trickle):
    """Sends its headers one byte at a time, a while apart (and never a body)."""

    def do_GET(self) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 1000:
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.05)


@pytest.mark.parametrize("handler", [_Trickle, _TrickleHeaders], ids=["body", "headers"])
def test_a_trickling_download_ends_at_its_deadline(handler, tmp_path, monkeypatch):
    from aiayn.data.config import DataConfig
    from aiayn.data.prepare import prepare
    from aiayn.data.sources import multi30k
    from aiayn.schema import to_schema

    monkeypatch.setattr(multi30k, "DEADLINE_S", 0.5)  # every read comes well within TIMEOUT_S
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/raw"
        settings = {"source": "multi30k", "root": None, "test_split": "test2016"}
        settings |= {"multi30k": {"download_url": url}, "cache_dir": str(tmp_path / "cache")}
        start = time.monotonic()
        with pytest.raises(AiaynError) as error:
            prepare(to_schema(settings, DataConfig))
        elapsed = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert url in str(error.value) and "timed out" in str(error.value)
    assert "in all" in str(error.value)
    assert elapsed < 10
    assert not [
        p for p in (tmp_path / "cache").rglob("*") if p.is_file() and ".locks" not in p.parts
    ]


def _trickle_tls_handshake(server: socket.socket, stop: threading.Event) -> None:
    """Accept connections and answer each ClientHello with a TLS record header promising
    16 kB, then one byte of it at a time, a while apart."""
    while not stop.is_set():
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection:
            connection.recv(4096)
            connection.sendall(b"\x16\x03\x03\x40\x00")
            while not stop.wait(0.05):
                try:
                    connection.sendall(b"\x02")
                except OSError:
                    break


@pytest.mark.parametrize("stall", ["name lookup", "TLS handshake"])
def test_a_stalled_connection_ends_at_the_download_deadline(stall, tmp_path, monkeypatch):
    """The deadline covers connecting too: a resolver that never answers, and a server that
    trickles its TLS handshake (each byte well within the per-read timeout)."""
    from aiayn.data.config import DataConfig
    from aiayn.data.prepare import prepare
    from aiayn.data.sources import multi30k
    from aiayn.schema import to_schema

    monkeypatch.setattr(multi30k, "DEADLINE_S", 0.5)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    stop = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    if stall == "name lookup":
        monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: stop.wait(60))
        url = "https://mirror.invalid/raw"
    else:
        threading.Thread(target=_trickle_tls_handshake, args=(server, stop), daemon=True).start()
        url = f"https://127.0.0.1:{server.getsockname()[1]}/raw"
    settings = {"source": "multi30k", "root": None, "test_split": "test2016"}
    settings |= {"multi30k": {"download_url": url}, "cache_dir": str(tmp_path / "cache")}
    start = time.monotonic()
    try:
        with pytest.raises(AiaynError) as error:
            prepare(to_schema(settings, DataConfig))
    finally:
        stop.set()
        server.close()
    elapsed = time.monotonic() - start
    assert f"downloading {url}/" in str(error.value) and "timed out" in str(error.value)
    assert "0.5 s in all" in str(error.value)
    assert elapsed < 10
    assert not [
        p for p in (tmp_path / "cache").rglob("*") if p.is_file() and ".locks" not in p.parts
    ]


LONG_LINES = {  # where the over-long line is -> the file's lines around it
    "first": (0, ["", "b c", "d e"]),
    "middle": (1, ["a b", "", "d e"]),
    "last, without a newline": (2, ["a b", "c d", ""]),
}


@pytest.mark.parametrize("case", sorted(LONG_LINES))
def test_an_over_long_line_is_never_held_whole(case, tmp_path):
    from aiayn.data.sources.text import MAX_LINE_BYTES, iter_lines

    where, lines = LONG_LINES[case]
    huge = "é" * (4 * MAX_LINE_BYTES)  # two bytes each: cut inside a character
    text = [huge if i == where else line for i, line in enumerate(lines)]
    path = tmp_path / "corpus.de"
    path.write_bytes(("\n".join(text) + ("" if where == 2 else "\n")).encode())
    tracemalloc.start()
    try:
        read = list(iter_lines(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(read) == 3
    assert [r for i, r in enumerate(read) if i != where] == [
        line for i, line in enumerate(lines) if i != where
    ]
    assert set(read[where]) == {"é"} and len(read[where].encode()) <= MAX_LINE_BYTES
    assert peak < 6 * MAX_LINE_BYTES  # the whole line alone is eight times the limit


def test_translate_cuts_an_over_long_input_line_as_it_reads(monkeypatch, ckpt, tmp_path):
    """The translation of a line beyond the limit is that of its first bytes (then truncated
    to the model's positions by on_long=truncate), and the lines after it keep their order."""
    from aiayn.data.sources import text
    from aiayn.inference.translate import run

    monkeypatch.setattr(text.bounded_lines, "__defaults__", (64,))
    source = tmp_path / "in.txt"
    source.write_text("a b\n" + "c d " * 1000 + "\ne f\n")
    out = tmp_path / "out.txt"
    settings = [f"ckpt_path={ckpt}", f"input={source}", f"output={out}", "progress=false"]
    settings += ["decode.max_len_a=0", "decode.max_len_b=3"]
    assert run(compose_config("translate", settings, tmp_path / "run")) == 3
    assert len(out.read_text().splitlines()) == 3


def test_check_output_is_the_one_owner(monkeypatch):
    """Every writer calls aiayn.outputs.check_output: no command keeps its own comparison."""
    src = Path(__file__).resolve().parents[2] / "src" / "aiayn"
    owners = [
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if "samefile" in p.read_text() or "st_ino" in p.read_text()
    ]
    assert sorted(owners) == ["data/sources/text.py", "outputs.py"]


# ------------------------------------------- a training run's writers stay in their own place


def _another_run(path: Path) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text("train: true\n")
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "best.ckpt").write_bytes(b"theirs")
    return path


WRITERS = {  # override -> the words of its refusal
    "another run's checkpoints": (
        "callbacks.model_checkpoint.dirpath={other}/checkpoints",
        "lies in the run {other}",
    ),
    "another run's CSV": ("logger=csv logger.csv.save_dir={other}", "lies in the run {other}"),
    "a user's directory": (
        "callbacks=[default,ema] callbacks.ema.dirpath={user}",
        "callbacks.ema.dirpath={user} holds files already",
    ),
    "a user's file": (
        "callbacks=[default,samples] callbacks.samples.path={user}/notes.txt",
        "callbacks.samples.path={user}/notes.txt holds files already",
    ),
}


@pytest.mark.parametrize("case", sorted(WRITERS))
def test_a_training_runs_writers_never_write_over_another_run_or_a_users_files(
    case, tmp_path, monkeypatch
):
    """A callback's or logger's path outside the run is refused before any work where it lies
    in another run, or where it holds files already (a new run there would write over them);
    by the first process of a launch only (the others start after it may have written)."""
    from aiayn.training.run import validate
    from tests.helpers import compose_train
    from tests.reliability.test_user_files import fingerprint

    other, user = _another_run(tmp_path / "other"), tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    override, words = (s.format(other=other, user=user) for s in WRITERS[case])
    before = fingerprint(tmp_path)
    cfg = compose_train(override.split(), output_dir=tmp_path / "out")
    with pytest.raises(ConfigError, match=re.escape(words)):
        validate(cfg)
    assert fingerprint(tmp_path) == before
    from aiayn import ownership

    monkeypatch.setattr(ownership, "_first_process", lambda: False)
    validate(cfg)  # another rank of the launch: rank 0 checked
    monkeypatch.undo()
    # W&B puts each run in a run-<id>/ of its own: a save_dir it shares is fine
    validate(compose_train(["logger=wandb", f"logger.wandb.save_dir={user}"], tmp_path / "o3"))
    # the same writer in a new directory of its own is fine
    fresh = override.replace(str(other), str(tmp_path / "new")).replace(
        str(user), str(tmp_path / "new")
    )
    validate(compose_train(fresh.split(), output_dir=tmp_path / "out2"))


def test_translate_never_writes_over_the_corpus_its_checkpoints_run_trained_on(tmp_path):
    """`output=` naming a file of the training run's corpus (found from the run config beside
    the checkpoint) is refused, as an input is."""
    from omegaconf import OmegaConf

    from aiayn.errors import OutputError
    from aiayn.inference.config import TranslateConfig
    from aiayn.inference.translate import _inputs
    from aiayn.outputs import check_output

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train", "val", "test"):
        for lang in ("en", "de"):
            (corpus / f"{name}.{lang}").write_text("a b\n")
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    files = {role: [f"{role}.en", f"{role}.de"] for role in ("train", "val", "test")}
    data = {"source": "files", "root": str(corpus), "files": files}
    OmegaConf.save({"data": data}, run / ".hydra" / "config.yaml")
    config = TranslateConfig(ckpt_path=str(run / "checkpoints" / "best.ckpt"), input="-")
    before = (corpus / "train.de").read_bytes()
    with pytest.raises(OutputError, match="the same file as a file of the corpus its run"):
        check_output(str(corpus / "train.de"), "output", _inputs(config))
    assert (corpus / "train.de").read_bytes() == before
    check_output(str(tmp_path / "hyp.de"), "output", _inputs(config))  # a new file: fine


# ---------------------------------------------- outputs that cannot be created: one line each


UNCREATABLE = {  # where the output goes -> the words of the refusal
    "under a file": ("{file}/out.txt", "lies under {file}, which is a file"),
    "under a file, deeper": ("{file}/a/b/out.txt", "lies under {file}, which is a file"),
    "in a directory nobody may write": ("{locked}/out.txt", "is not writable here"),
}


@pytest.mark.parametrize("case", sorted(UNCREATABLE))
def test_an_output_that_cannot_be_created_is_refused_before_any_work(case, tmp_path):
    """translate's output, average's and curves' -o (check_output), and the directories of
    visualize, export and Hydra's runs and sweeps (check_output_dir): an output under a file
    or in a directory no one may write is one line, not an OSError from deep inside."""
    import os

    from aiayn.outputs import check_output, check_output_dir

    if case.startswith("in a directory nobody") and os.geteuid() == 0:
        pytest.skip("root may write anywhere: the permission check cannot refuse it")
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "locked").mkdir(mode=0o500)
    where, words = (
        s.format(file=tmp_path / "afile", locked=tmp_path / "locked") for s in UNCREATABLE[case]
    )
    with pytest.raises(OutputError, match=re.escape(words)):
        check_output(where, "output")
    with pytest.raises(OutputError, match=re.escape(words)):
        check_output_dir(str(Path(where).parent / "dir"), "output_dir")
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_an_output_directory_that_is_a_file_is_refused(tmp_path):
    from aiayn.outputs import check_output_dir

    (tmp_path / "afile").write_text("mine\n")
    with pytest.raises(OutputError, match=r"output_dir=.*afile is a file: name a directory"):
        check_output_dir(tmp_path / "afile", "output_dir")
    assert check_output_dir(tmp_path / "new" / "dir", "output_dir") == tmp_path / "new" / "dir"


RUN_DIRS = {  # a command's directories under a file -> the words of its one line
    "train hydra.run.dir": (["hydra.run.dir={file}/r"], "hydra.run.dir={file}/r lies under"),
    "train paths.log_dir": (["paths.log_dir={file}/logs"], "cannot create the run directory"),
    "a sweep's hydra.sweep.dir": (
        ["-m", "seed=1,2", "hydra.sweep.dir={file}/s"],
        "hydra.sweep.dir={file}/s lies under",
    ),
}


@pytest.mark.parametrize("case", sorted(RUN_DIRS))  # each refused in about 2 s
def test_a_run_directory_that_cannot_be_created_is_one_line(case, tmp_path):
    """Hydra makes these directories in its own machinery (an interpolation, a callback),
    where an exception was a 40-line traceback: now one line and exit 1, nothing created."""
    from tests.helpers import cli

    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    args, words = RUN_DIRS[case]
    args = [a.format(file=afile) for a in args]
    flags = [a for a in args if a.startswith("-")]  # -m before the overrides
    result = cli([*flags, "model=tiny", *[a for a in args if a not in flags]], tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words.format(file=afile) in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert afile.read_text() == "mine\n"


# ------------------------------------------------- decode values: finite, and room to decode

DECODE_VALUES = {  # DecodeConfig settings -> the words of the refusal
    "length_penalty nan": ({"length_penalty": float("nan")}, "length_penalty must be a finite"),
    "max_len_a inf": ({"max_len_a": float("inf")}, "max_len_a must be a finite number"),
    "max_len_a nan": ({"max_len_a": float("nan")}, "max_len_a must be a finite number"),
    "temperature inf": ({"temperature": float("inf")}, "temperature must be a finite number"),
    "max_len_b -100 with a 0": (
        {"max_len_a": 0, "max_len_b": -100},
        "max_len_b=-100 with max_len_a=0 cuts every output to one token",
    ),
}


@pytest.mark.parametrize("case", sorted(DECODE_VALUES))
def test_a_decode_value_that_cannot_decode_is_named(case):
    """NaN and infinite settings (accepted before, with nan scores, or an OverflowError from
    deep inside) and a length limit that leaves one token are refused by name."""
    from aiayn.model.generate import DecodeConfig

    settings, words = DECODE_VALUES[case]
    with pytest.raises(ValueError, match=re.escape(words)):
        DecodeConfig(**settings)
    assert DecodeConfig(max_len_a=1.5, max_len_b=-2).max_len_b == -2  # room left: fine


def test_a_beam_wider_than_the_target_vocabulary_is_refused(run_dir):
    """A beam wider than the target vocabulary (which ran on and on before) is one line
    naming the vocabulary, for the torch and the CTranslate2 engines alike (`check_beam`)."""
    from aiayn.inference import load_checkpoint

    translator = load_checkpoint(run_dir / "checkpoints" / "last.ckpt", "cpu")
    vocab = translator.tokenizers.tgt_vocab_size
    with pytest.raises(ConfigError, match=rf"decode\.beam_size={vocab + 1} exceeds the target"):
        translator.with_settings({"strategy": "beam", "beam_size": vocab + 1})
    assert (
        translator.with_settings({"strategy": "beam", "beam_size": vocab}).decode.beam_size == vocab
    )


# -------------------------------------------- a checkpoint's stored settings, damaged or foreign

DAMAGED = {  # what the copy of the checkpoint holds -> the words of the refusal
    "a model key of another version": (
        ("hyper_parameters", "model", "zzz"),
        1,
        "stored model settings do not load (config key 'zzz'",
    ),
    "d_model as text": (("hyper_parameters", "model", "d_model"), "sixty", "config key 'd_model'"),
    "heads that do not divide d_model": (
        ("hyper_parameters", "model", "num_heads"),
        3,
        "num_heads",
    ),
    "model settings missing": (("hyper_parameters", "model"), None, "ModelConfig hyper-parameters"),
    "a beam of 0": (
        ("hyper_parameters", "decode", "beam_size"),
        0,
        "stored decode settings do not load",
    ),
    "decode as text": (("hyper_parameters", "decode"), "beam", "DecodeConfig hyper-parameters"),
    "a tokenizer that is not JSON": (("tokenizers", "joint"), "{bad", "the tokenizer it carries"),
    "weights as a list": (("state_dict",), [1, 2], "state_dict is not a mapping"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_checkpoint_with_damaged_settings_is_one_line_naming_it(case, run_dir, tmp_path):
    """translate, evaluate, export and visualize load through `load_checkpoint`: a stored
    setting of another version or a damaged one was a TypeError or ValueError traceback."""
    from aiayn.inference import load_checkpoint

    keys, value, words = DAMAGED[case]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    node = checkpoint
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    damaged = tmp_path / "damaged.ckpt"
    torch.save(checkpoint, damaged)
    with pytest.raises(CheckpointError, match=re.escape(words)):
        load_checkpoint(damaged, "cpu")


def test_nan_weights_are_refused_by_translate_and_average(run_dir, tmp_path, capsys):
    """A diverged run's checkpoint (NaN weights) decoded to empty lines and averaged with exit
    0; now each names the weight."""
    from aiayn.cli.average import main as average
    from aiayn.inference import load_checkpoint

    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    key = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point())
    checkpoint["state_dict"][key] = torch.full_like(checkpoint["state_dict"][key], float("nan"))
    diverged = tmp_path / "diverged.ckpt"
    torch.save(checkpoint, diverged)
    with pytest.raises(
        CheckpointError, match=rf"weight {re.escape(key.removeprefix('model.'))} holds NaN"
    ):
        load_checkpoint(diverged, "cpu")
    with pytest.raises(SystemExit):
        average([str(last), str(diverged), "-o", str(tmp_path / "avg.ckpt")])
    assert "holds NaN or infinity (a diverged run)" in capsys.readouterr().err
    assert not (tmp_path / "avg.ckpt").exists()


@pytest.mark.parametrize("root", ["corpus", None])
def test_a_runs_relative_corpus_is_read_where_the_run_started(root, tmp_path, monkeypatch):
    """evaluate.py without data= reads the run's data config: a relative data.root (or a files
    corpus without one) is the run's own corpus, from the directory it started in (its
    hydra.runtime.cwd), not whatever ./corpus is where evaluate runs."""
    from omegaconf import OmegaConf

    from aiayn.data.sources import get_source, local_files
    from aiayn.inference.checkpoint import run_data_config

    started, elsewhere = tmp_path / "started", tmp_path / "elsewhere"
    for place in (started, elsewhere):
        (place / "corpus").mkdir(parents=True)
    run = started / "run"
    (run / ".hydra").mkdir(parents=True)
    prefix = "" if root else "corpus/"
    files = {r: [f"{prefix}{r}.en", f"{prefix}{r}.de"] for r in ("train", "val", "test")}
    OmegaConf.save(
        {"data": {"source": "files", "root": root, "files": files}}, run / ".hydra" / "config.yaml"
    )
    OmegaConf.save({"hydra": {"runtime": {"cwd": str(started)}}}, run / ".hydra" / "hydra.yaml")
    monkeypatch.chdir(elsewhere)
    data = run_data_config(run / "checkpoints" / "best.ckpt")
    read = local_files(get_source(data))
    assert read and all(path.resolve().is_relative_to(started / "corpus") for path in read)


def test_a_byte_order_mark_and_a_last_blank_jsonl_line_read_as_text(tmp_path):
    """A UTF-8 byte-order mark (some editors write one) no longer hides a TSV's first column
    or rides along in the first sentence; a JSONL file's last blank line holds no record."""
    from aiayn.data.sources.text import iter_aligned, iter_jsonl, iter_tsv

    tsv = tmp_path / "train.tsv"
    tsv.write_bytes("\ufeffen\tde\nhello\thallo\n".encode())
    assert list(iter_tsv(tsv, ("en", "de"))) == [("hello", "hallo")]
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes("\ufeffhello\nworld\n".encode())
    tgt.write_bytes(b"hallo\r\nwelt\r\n")
    assert list(iter_aligned(src, tgt, "train")) == [("hello", "hallo"), ("world", "welt")]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"en": "hello", "de": "hallo"}\n\n')
    assert list(iter_jsonl(jsonl, ("en", "de"), None)) == [("hello", "hallo")]


@pytest.mark.parametrize("key", ["input", "prefix_file"])
def test_a_directory_as_translates_input_is_named_as_such(key, run_dir, tmp_path):
    """A directory given as input (or prefix file) is named for what it is, before the output
    check lists its files (which named one of them as the clash)."""
    from aiayn.errors import TranslationError
    from aiayn.inference.translate import run

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "o.txt").write_text("a b\n")
    settings = [f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", f"input={folder / 'o.txt'}"]
    settings = [s for s in settings if not s.startswith(f"{key}=")] + [f"{key}={folder}"]
    before = fingerprint(folder)
    with pytest.raises(TranslationError, match=rf"^{key} {re.escape(str(folder))} is a directory"):
        run(compose_config("translate", [*settings, f"output={tmp_path / 'hyp.txt'}"], tmp_path))
    assert fingerprint(folder) == before and not (tmp_path / "hyp.txt").exists()


@pytest.mark.parametrize("blank", [("val", "en"), ("test", "de")])
def test_a_val_or_test_split_with_every_line_of_a_side_blank_is_refused(blank, tmp_path):
    """A wrong file or column (all blank) is refused naming the split and its files: blank
    sources were kept and scored as if they were the split."""
    from aiayn.data.config import DataConfig
    from aiayn.data.prepare import prepare
    from aiayn.schema import to_schema

    words = ["a b c", "b c d", "c d e", "d e a"] * 10
    for role in ("train", "val", "test"):
        for lang in ("en", "de"):
            lines = [""] * len(words) if (role, lang) == blank else words
            (tmp_path / f"{role}.{lang}").write_text("\n".join(lines) + "\n")
    files = {r: [f"{r}.en", f"{r}.de"] for r in ("train", "val", "test")}
    settings = {"source": "files", "root": str(tmp_path), "files": files}
    settings |= {"cache_dir": str(tmp_path / "cache"), "tokenizer": {"vocab_size": 60}}
    side = {"en": "source line", "de": r"reference \(target line\)"}[blank[1]]
    with pytest.raises(AiaynError, match=rf"every {side} of the {blank[0]} split is empty"):
        prepare(to_schema(settings, DataConfig))


def test_a_sigterm_during_an_export_leaves_no_staging_directory(run_dir, tmp_path, monkeypatch):
    """SIGTERM mid-conversion: exit 143's StoppedError, the hidden staging directory beside
    the output removed, no output, and the previous SIGTERM handler back."""
    import os
    import signal

    pytest.importorskip("ctranslate2")
    from aiayn.cli.export import run
    from aiayn.errors import StoppedError
    from aiayn.export import ctranslate2

    save_spec = ctranslate2.save_spec

    def save_then_stop(*args: object, **kwargs: object) -> None:
        save_spec(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ctranslate2, "save_spec", save_then_stop)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "exports" / "model"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    cfg = compose_config("export", [f"ckpt_path={ckpt}", f"output_dir={out}"], tmp_path / "e")
    with pytest.raises(StoppedError, match="SIGTERM stopped the export") as error:
        run(cfg)
    assert error.value.exit_code == 143
    assert list((tmp_path / "exports").iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == before
