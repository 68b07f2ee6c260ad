"""Checkpoint files without Lightning: read (safely), write (atomically), and load a
`Translator` from one.

A checkpoint written by `python train.py` holds `state_dict` (the LightningModule's: the
Transformer's weights under `model.`), `hyper_parameters` (`model`, `optim`, `decode`, ...),
`tokenizers` (the tokenizer JSON, so a checkpoint alone translates), `rng_states` and the
trainer's state. Reading uses `torch.load(weights_only=True)`: a file cannot run code.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from aiayn.data.config import DataConfig
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import CheckpointError, ConfigError, DataError, writing
from aiayn.inference.translator import Translator
from aiayn.kernels import accelerate
from aiayn.kernels.machine import bf16_native
from aiayn.model import DecodeConfig, ModelConfig, build_model
from aiayn.schema import SCHEMA_KEYS, to_schema

MODEL_PREFIX = "model."  # the Transformer's weights inside the LightningModule's state_dict


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict of `path` on the CPU (memory-mapped); CheckpointError for a missing
    file or one that is not a checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} not found: give ckpt_path=<run dir>/checkpoints/best.ckpt"
        )
    hint = "give ckpt_path=<run dir>/checkpoints/best.ckpt"
    checkpoint = load_tensors(
        path, hint, "is it a checkpoint written by `python train.py` (or aiayn.averaging)?"
    )
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not an aiayn checkpoint (no state_dict)")
    return checkpoint


def load_tensors(path: Path, hint: str, question: str | None = None) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU (memory-mapped), or one
    CheckpointError naming the file, what is wrong, and `hint` (what to do): for a file that
    is not torch's zip archive, or one `weights_only` refuses (a pickle that would run code)."""
    with open(path, "rb") as file:
        head = file.read(4)
    if head != b"PK\x03\x04":  # torch.save writes a zip archive (since torch 1.6)
        raise CheckpointError(
            f"{path} is not a checkpoint (not the zip archive torch.save writes: it starts with "
            f"{head!r}); {hint}"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises many types for foreign or broken files
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise CheckpointError(
            f"cannot read checkpoint {path} ({type(error).__name__}: {first}); {question or hint}"
        ) from None


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """`torch.save(checkpoint, path)` through `.<name>.tmp` beside it, fsync, then a rename:
    a process killed mid-write leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    kept = f"; {path.name} as it was before is intact" if path.exists() else ""
    try:
        with writing(path, tensor_bytes(checkpoint), kept), open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a partial file would only fill the disk further
        raise
    os.replace(tmp, path)


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in a (nested) checkpoint: about its size on disk."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def load_checkpoint(
    ckpt_path: str | Path,
    device: str = "auto",
    tokenizer: str | None = None,
    dtype: str = "float32",
) -> Translator:
    """A `Translator` for the checkpoint: its model in eval mode on `device` with its weights
    in `dtype` (`resolve_dtype`; decoding sums its scores in float32 whatever it is) and the
    kernels for its device (`aiayn.kernels.accelerate`: the CPU kernels on the CPU), its
    tokenizer, and its decode settings.

    `tokenizer` (a tokenizer.json or a directory written by `Tokenizers.save`) stands in for a
    checkpoint that carries none; one that differs from the checkpoint's own is refused.
    """
    path = Path(ckpt_path)
    checkpoint = read_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters") or {}
    if not isinstance(hparams, dict) or "model" not in hparams:
        raise CheckpointError(f"{path} has no model hyper-parameters: not an aiayn checkpoint")
    config = _settings(path, hparams["model"], ModelConfig)
    model = build_model(config)
    weights = model_weights(checkpoint)
    bad = nonfinite_weight(weights)
    if bad is not None:
        raise CheckpointError(
            f"{path}: weight {bad} holds NaN or infinity (a diverged run): it would translate "
            "to empty lines; use an earlier checkpoint of the run"
        )
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        raise CheckpointError(f"{path}: weights do not fit its model config ({error})") from None
    tokenizers = _tokenizers(path, checkpoint.get("tokenizers"), tokenizer)
    _check_vocab(tokenizers, config, tokenizer or str(path))
    decode = _settings(path, hparams.get("decode") or {}, DecodeConfig)
    where = resolve_device(device)
    model = accelerate(model.to(where, resolve_dtype(dtype, where)).eval(), "auto")
    return Translator(model, tokenizers, decode)


def _settings(path: Path, stored: Any, schema: type) -> Any:
    """The checkpoint's stored `model` or `decode` settings as `schema`; a CheckpointError
    naming the checkpoint and the key where they are not that (damaged, or written by
    another version of aiayn)."""
    if not isinstance(stored, dict):
        raise CheckpointError(
            f"{path}: its {schema.__name__} hyper-parameters are {type(stored).__name__}, not "
            "settings: a damaged checkpoint or not aiayn's"
        )
    try:
        return to_schema(stored, schema)
    except ConfigError as error:
        raise CheckpointError(
            f"{path}: its stored {SCHEMA_KEYS[schema.__name__]} settings do not load ({error}); "
            "a damaged checkpoint, or one written by another version of aiayn"
        ) from None


def nonfinite_weight(state: dict[str, Any]) -> str | None:
    """The first floating weight of `state` holding NaN or infinity (a diverged run's), or
    None."""
    return next(
        (
            name
            for name, tensor in state.items()
            if isinstance(tensor, torch.Tensor)
            and tensor.is_floating_point()
            and not bool(torch.isfinite(tensor).all())
        ),
        None,
    )


def model_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The Transformer's state_dict inside a checkpoint (the module's `model.` entries)."""
    if not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError("the checkpoint's state_dict is not a mapping of weights: damaged")
    return {
        key.removeprefix(MODEL_PREFIX): value
        for key, value in checkpoint["state_dict"].items()
        if key.startswith(MODEL_PREFIX)
    }


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda if available, else cpu; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"device={device!r} is not a device: use cpu, cuda, cuda:<n> or auto"
        ) from None
    if resolved.type == "cuda":
        check_cuda(device, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return resolved


def check_cuda(device: str, count: int) -> None:
    """ConfigError naming `device` ('cuda' or 'cuda:<n>') where this machine has `count`
    CUDA devices, fewer than it needs."""
    index = int(device.split(":")[1]) if ":" in device else 0
    if index < count:
        return
    have = f"only {count} CUDA device(s)" if count else "no CUDA device"
    raise ConfigError(
        f"device={device!r}, but this machine has {have} (a CPU-only PyTorch, or no GPU "
        "visible): use device=cpu, or device=auto to take a GPU where there is one"
    )


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The weights' dtype for decoding: 'auto' -> bfloat16 on a CUDA GPU with native bf16,
    float16 on an older one, float32 on the CPU; or one of `DTYPES` by name."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if bf16_native(device) else torch.float16
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def _tokenizers(path: Path, state: dict[str, str] | None, given: str | None) -> Tokenizers:
    try:
        own = Tokenizers.from_state(state) if state else None
    except Exception as error:  # the tokenizers library's own, of any type
        if given is None:
            raise CheckpointError(
                f"{path}: the tokenizer it carries does not load ({error}): a damaged "
                "checkpoint; give tokenizer=<run dir>/tokenizer.json of its run"
            ) from None
        own = None  # nothing to compare the given one with
    if given is None:
        if own is None:
            raise CheckpointError(
                f"checkpoint {path} carries no tokenizer: pass tokenizer=<run dir>/tokenizer.json"
            )
        return own
    try:
        tokenizers = Tokenizers.load(given)
    except DataError as error:
        raise CheckpointError(str(error)) from None
    if own is not None and tokenizers.state() != own.state():
        raise CheckpointError(
            f"tokenizer {given} differs from the one checkpoint {path} was trained with "
            "(which it carries): drop tokenizer=... to use that one"
        )
    return tokenizers


def _check_vocab(tokenizers: Tokenizers, config: ModelConfig, origin: str) -> None:
    for side, have, want in (
        ("src", tokenizers.src_vocab_size, config.src_vocab_size),
        ("tgt", tokenizers.tgt_vocab_size, config.tgt_vocab_size),
    ):
        if have != want:
            raise CheckpointError(
                f"tokenizer from {origin} has a {side} vocabulary of {have} tokens but the "
                f"model expects {want}: use the tokenizer.json of the run that wrote the "
                "checkpoint"
            )


def _rooted(data: DataConfig, hydra_record: Path) -> DataConfig:
    """`data` with a relative `root` joined to the run's starting directory, and a files
    corpus without a root given that directory as its root (its paths are relative to it)."""
    try:
        cwd = OmegaConf.select(OmegaConf.load(hydra_record), "hydra.runtime.cwd")
    except Exception:  # no record, or not Hydra's: the paths stay as stored
        return data
    if not cwd:
        return data
    if data.root and not Path(data.root).is_absolute():
        return replace(data, root=str(Path(cwd) / data.root))
    if data.root is None and data.source == "files":
        return replace(data, root=str(cwd))
    return data


def run_data_config(ckpt_path: str | Path) -> DataConfig:
    """The `data` config of the training run that wrote `ckpt_path` (its `.hydra/config.yaml`
    in the checkpoint's directory or the one above), its relative paths read from the
    directory the run was started in (`hydra.runtime.cwd`), not this command's: a corpus
    given as `data.root=corpus` is that run's corpus wherever evaluate.py runs."""
    here = Path(ckpt_path).resolve().parent
    for directory in (here, here.parent):
        saved = directory / ".hydra" / "config.yaml"
        if saved.is_file():
            try:
                data = OmegaConf.load(saved).data
            except Exception as error:  # YAML's, OmegaConf's: a damaged or foreign file
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise ConfigError(
                    f"{saved} (the run config of {Path(ckpt_path).name}) cannot be read as a "
                    f"run's config ({type(error).__name__}: {first}); choose the corpus "
                    "instead, e.g. data=multi30k"
                ) from None
            return _rooted(to_schema(data, DataConfig), directory / ".hydra" / "hydra.yaml")
    raise ConfigError(
        f"data is not set and no .hydra/config.yaml was found beside {ckpt_path}: choose the "
        "corpus, e.g. data=multi30k"
    )
