"""Convert an aiayn checkpoint to a CTranslate2 model directory (the engine OpenNMT, fairseq
and Hugging Face users deploy with), and find or make the cached conversion of a checkpoint.

Every `ModelConfig` converts exactly: post- and pre-norm, sinusoidal and learned positions
(written out as a position table), relu and gelu, any `head_dim`, each `share_embeddings`
mode, and factorized embeddings (`d_embed`: the projection is folded into a full
`(V, d_model)` table, which is exact but no longer small); dropout does not matter at
inference. One setting is refused with a message naming it: `final_norm` on post-norm
stacks (torch.nn.Transformer's default), which CTranslate2's post-norm layout lacks.
CTranslate2 reads token strings, so the vocabulary is the tokenizer's tokens in id order.
The directory also holds `tokenizer.json` (or the src/tgt pair)
and `aiayn.json` (model config, decode settings, the run's data config, and the checkpoint's
SHA-256), so it translates on its own: `translate.py ct2_path=<dir>`.

Needs the optional extra: `pip install -e ".[export]"`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.data.special import UNK_TOKEN
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import CheckpointError, ConfigError, writing
from aiayn.model import Model, ModelConfig, Transformer
from aiayn.model.attention import SharedHeadProjection
from aiayn.outputs import EXPORT_FILES, check_output_dir

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "float16", "bfloat16")
METADATA = "aiayn.json"
MODEL_FILE = "model.bin"
FORMAT_VERSION = 1


def ctranslate2_module() -> Any:
    """The `ctranslate2` module, or a ConfigError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(
            "CTranslate2 is not installed: pip install -e '.[export]' (or pip install ctranslate2)"
        ) from None
    return ctranslate2


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).contiguous().numpy()


def _linear(spec: Any, layer: torch.nn.Module) -> None:
    """An nn.Linear, or a `SharedHeadProjection` as its block-diagonal dense weight."""
    spec.weight = _np(layer.dense() if isinstance(layer, SharedHeadProjection) else layer.weight)
    if layer.bias is not None:
        spec.bias = _np(layer.bias)


def _norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    """CTranslate2's LayerNorm always adds a beta: zeros for a bias-free one (norm_bias)."""
    beta = norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)
    spec.gamma, spec.beta = _np(norm.weight), _np(beta)


def _token_table(token: torch.nn.Module, d_model: int) -> tuple[np.ndarray, bool]:
    """The `(V, d_model)` input table and whether CTranslate2 must scale it by sqrt(d_model).

    Plain embeddings keep their (possibly tied) matrix and CTranslate2's own scaling; a
    factorized one is folded: `((E * s) @ P^T + b) * s'`, already scaled."""
    if token.proj is None:
        return _np(token.weight), token.scale != 1.0  # model.scale_embeddings
    folded = (token.weight.detach().double() * token.scale) @ token.proj.weight.detach().double().T
    if token.proj.bias is not None:  # model.embedding_proj_bias: the same for every token
        folded = folded + token.proj.bias.detach().double()
    return (folded * token.out_scale).float().numpy(), False


def _output_table(model: Transformer) -> np.ndarray:
    """The `(V, d_model)` output projection (`W @ P` when factorized)."""
    output = model.output
    if output.proj is None:
        return _np(output.weight)
    return (output.weight.detach().double() @ output.proj.weight.detach().double()).float().numpy()


def _positions(embedding: torch.nn.Module, config: ModelConfig) -> np.ndarray:
    """The `(max_positions, d_model)` table added after the token embedding."""
    return _np(embedding.positional(config.max_positions, 0))


def model_spec(model: Model, src_vocab: list[str], tgt_vocab: list[str]) -> Any:
    """The CTranslate2 `TransformerSpec` of `model`, weights set, the vocabularies (token
    strings in id order, specials at the model's ids) registered."""
    ctranslate2_module()
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    if config.arch != "transformer":
        raise ConfigError(
            f"CTranslate2 export converts Transformers; this model is model.arch={config.arch!r}"
            ": decode it with engine=torch"
        )
    if config.has_final_norm and not config.norm_first:
        raise ConfigError(
            "CTranslate2 cannot express model.final_norm=true on post-norm stacks "
            "(model.norm_first=false): decode this model with engine=torch"
        )
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    common = {
        "pre_norm": config.norm_first,
        "activation": activation[config.activation],
        "head_dim": config.head_dim,
        "no_final_norm": not config.has_final_norm,
        "layernorm_embedding": config.embedding_norm,
    }
    encoder = transformer_spec.TransformerEncoderSpec(
        config.num_encoder_layers, config.num_heads, **common
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        config.num_decoder_layers, config.num_heads, **common
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = model.encoder.layers[0].norm1.eps

    d = config.d_model
    encoder.embeddings[0].weight, encoder.scale_embeddings = _token_table(model.src_embed.token, d)
    decoder.embeddings.weight, decoder.scale_embeddings = _token_table(model.tgt_embed.token, d)
    encoder.position_encodings.encodings = _positions(model.src_embed, config)
    decoder.position_encodings.encodings = _positions(model.tgt_embed, config)
    decoder.projection.weight = _output_table(model)
    if model.output.bias is not None:
        decoder.projection.bias = _np(model.output.bias)

    for layer_spec, layer in zip(encoder.layer, model.encoder.layers, strict=True):
        attention = layer_spec.self_attention
        _linear(attention.linear[0], layer.self_attn.qkv_proj)
        _linear(attention.linear[1], layer.self_attn.out_proj)
        _norm(attention.layer_norm, layer.norm1)
        _feed_forward(layer_spec.ffn, layer.ff, layer.norm2)
    for layer_spec, layer in zip(decoder.layer, model.decoder.layers, strict=True):
        _linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(layer_spec.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(layer_spec.self_attention.layer_norm, layer.norm1)
        _linear(layer_spec.attention.linear[0], layer.cross_attn.q_proj)
        _linear(layer_spec.attention.linear[1], layer.cross_attn.kv_proj)
        _linear(layer_spec.attention.linear[2], layer.cross_attn.out_proj)
        _norm(layer_spec.attention.layer_norm, layer.norm2)
        _feed_forward(layer_spec.ffn, layer.ff, layer.norm3)
    if config.embedding_norm:
        _norm(encoder.layernorm_embedding, model.src_embed.norm)
        _norm(decoder.layernorm_embedding, model.tgt_embed.norm)
    if config.has_final_norm:
        _norm(encoder.layer_norm, model.encoder.norm)
        _norm(decoder.layer_norm, model.decoder.norm)

    bos, eos = tgt_vocab[config.bos_id], tgt_vocab[config.eos_id]
    spec.config.bos_token, spec.config.eos_token = bos, eos
    spec.config.unk_token, spec.config.decoder_start_token = UNK_TOKEN, bos
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec


def _feed_forward(spec: Any, ff: torch.nn.Module, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear_0, ff.linear1)
    _linear(spec.linear_1, ff.linear2)
    _norm(spec.layer_norm, norm)


def save_spec(spec: Any, directory: Path, quantization: str = "float32") -> None:
    """Validate, quantize (unless float32) and write `spec` into `directory`."""
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    spec.save(str(directory))


def vocabulary(tokenizers: Tokenizers, side: str) -> list[str]:
    """The tokens of `side` in id order (CTranslate2's vocabulary)."""
    tokenizer = tokenizers.src if side == "src" else tokenizers.tgt
    by_id = {i: token for token, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    size = tokenizer.get_vocab_size()
    missing = [i for i in range(size) if i not in by_id]
    if missing:
        raise CheckpointError(f"the {side} tokenizer has no token for id {missing[0]}")
    return [by_id[i] for i in range(size)]


# CTranslate2's variable types, by the id its model.bin stores (ctranslate2.specs.model_spec)
SCALAR_TYPES = {0: "f", 1: "b", 2: "h", 3: "i"}


def model_variables(path: Path) -> dict[str, tuple[int, ...] | float]:
    """The variables of a CTranslate2 `model.bin`, read from its header without loading the
    weights: name -> shape (a tuple), or the value of a scalar (`encoder/num_heads`); an alias
    maps to what it names. CheckpointError for a file that is not one."""
    variables: dict[str, tuple[int, ...] | float] = {}
    try:
        with open(path, "rb") as file:

            def number(fmt: str) -> Any:
                return struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]

            def string() -> str:
                return file.read(number("H"))[:-1].decode("utf-8")

            number("I"), string(), number("I")  # binary version, spec name, revision
            for _ in range(number("I")):
                name, rank = string(), number("B")
                shape = tuple(number("I") for _ in range(rank))
                kind, size = number("B"), number("I")
                if (
                    not shape
                    and kind in SCALAR_TYPES
                    and size == struct.calcsize(SCALAR_TYPES[kind])
                ):
                    variables[name] = number(SCALAR_TYPES[kind])
                else:
                    variables[name] = shape
                    file.seek(size, 1)
            for _ in range(number("I")):
                alias, name = string(), string()
                variables[alias] = variables[name]
    except (struct.error, UnicodeDecodeError, KeyError, OSError) as error:
        raise CheckpointError(
            f"{path} is not a CTranslate2 model ({type(error).__name__}: {error}); export the "
            "checkpoint again"
        ) from None
    return variables


def file_digest(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export(
    ckpt_path: str | Path,
    output_dir: str | Path,
    quantization: str = "float32",
    force: bool = False,
) -> Path:
    """Convert the checkpoint to a CTranslate2 directory at `output_dir` (written beside it
    and renamed into place, so a failed conversion leaves nothing half-written)."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    ctranslate2_module()
    ckpt_path, output_dir = Path(ckpt_path), Path(output_dir)
    check_replaceable(output_dir, force)
    check_output_dir(output_dir, "output_dir")
    return _convert(ckpt_path, output_dir, quantization)


def _move_aside(directory: Path) -> None:
    """Remove `directory` by renaming it to a private name first (atomic: a reader sees it
    whole or not at all), then deleting that; nothing if another process moved it first."""
    aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
    try:
        directory.rename(aside / directory.name)
    except FileNotFoundError:
        pass
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _convert(
    ckpt_path: Path, output_dir: Path, quantization: str, digest: str | None = None
) -> Path:
    """Write the export into a private directory beside `output_dir`, then put it in place of
    what is there (moved aside only then, so a failed conversion keeps it). `digest`: the
    checkpoint's SHA-256 where `output_dir` is its conversion cache, which another process
    may have written meanwhile: its conversion is then used, and this one dropped."""
    from aiayn.inference.checkpoint import load_checkpoint, run_data_config

    translator = load_checkpoint(ckpt_path, device="cpu")
    tokenizers = translator.tokenizers
    vocabularies = vocabulary(tokenizers, "src"), vocabulary(tokenizers, "tgt")
    spec = model_spec(translator.model, *vocabularies)
    try:
        data = asdict(run_data_config(ckpt_path))
    except ConfigError:
        data = None  # a checkpoint outside its run directory: evaluate then needs data=...
    metadata = {
        "format_version": FORMAT_VERSION,
        "checkpoint": str(ckpt_path.resolve()),
        "checkpoint_sha256": digest or file_digest(ckpt_path),
        "quantization": quantization,
        "model": asdict(translator.model.config),
        "decode": asdict(translator.decode),
        "data": data,
    }
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    kept = "; nothing was written" + (f", {output_dir} is as it was" if output_dir.exists() else "")
    try:
        with writing(output_dir, kept=kept):
            save_spec(spec, staging, quantization)
            metadata["model_sha256"] = file_digest(staging / MODEL_FILE)
            translator.tokenizers.save(staging)
            text = json.dumps(metadata, indent=2) + "\n"
            (staging / METADATA).write_text(text, encoding="utf-8")
        if digest is not None and _converts(output_dir, digest):
            return output_dir
        if output_dir.exists():
            _move_aside(output_dir)
        try:
            staging.rename(output_dir)
        except OSError:  # ENOTEMPTY or EEXIST: another process's directory came first
            if digest is not None and _converts(output_dir, digest):
                return output_dir
            raise ConfigError(
                f"{output_dir} was written by another process meanwhile; nothing of this "
                "conversion was kept: run again"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir


def check_replaceable(output_dir: Path, force: bool) -> None:
    """Refuse to write `output_dir` over anything but an earlier export that `force` allows:
    a file, a directory holding other files (a run, its checkpoints, the working directory),
    or a directory whose metadata is missing or unreadable. An empty directory is fine."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise ConfigError(f"output_dir {output_dir} is a file: choose a new directory")
    entries = sorted(p.name for p in output_dir.iterdir())
    if not entries:
        return
    if not force:
        raise ConfigError(
            f"output_dir {output_dir} exists: choose a new directory, or set force=true to "
            "replace an earlier export there"
        )
    if output_dir.resolve() in (Path.cwd().resolve(), Path.home().resolve(), Path("/")):
        raise ConfigError(f"output_dir {output_dir} is not an export: choose a new directory")
    foreign = [name for name in entries if not EXPORT_FILES.match(name)]
    if foreign:
        raise ConfigError(
            f"output_dir {output_dir} holds files an export does not ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); nothing was changed: choose a new directory"
        )
    try:
        read_metadata(output_dir)
    except CheckpointError as error:
        raise ConfigError(
            f"force=true replaces only an earlier aiayn export, and {error}; nothing was "
            "changed: choose a new directory"
        ) from None


def conversion_cache() -> Path:
    """Where checkpoints' CTranslate2 conversions are kept: ``AIAYN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/aiayn``, else ``~/.cache/aiayn``; each under ``ct2/<SHA-256>/``. Never
    inside a run: evaluating or translating a run writes nothing into it."""
    root = os.environ.get("AIAYN_CACHE_DIR")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aiayn")
    return Path(root) / "ct2"


def cached_export(ckpt_path: str | Path) -> Path:
    """The float32 conversion of `ckpt_path`, kept in `conversion_cache()` under the SHA-256
    of its bytes: converted on first use, again whenever the checkpoint's bytes change (e.g.
    last.ckpt rewritten), and shared by copies of the same checkpoint."""
    ckpt_path = Path(ckpt_path)
    if not ckpt_path.is_file():
        raise CheckpointError(
            f"checkpoint {ckpt_path} not found: give ckpt_path=<run dir>/checkpoints/best.ckpt"
        )
    digest = file_digest(ckpt_path)
    cache = conversion_cache() / digest
    if cache.exists() and not (cache / METADATA).is_file():
        raise CheckpointError(
            f"{cache}, where the CTranslate2 conversion of {ckpt_path.name} is kept, is taken "
            "by something else: move it away (or set AIAYN_CACHE_DIR), or give "
            "ct2_path=<an exported directory>"
        )
    if _converts(cache, digest):
        return cache
    converted = _convert(ckpt_path, cache, "float32", digest)
    _drop_earlier_conversions(ckpt_path, keep=converted)
    return converted


def _drop_earlier_conversions(ckpt_path: Path, keep: Path) -> None:
    """Remove the cached conversions of earlier bytes of `ckpt_path` (a `last.ckpt` since
    rewritten), so that decoding a training run again and again keeps one conversion."""
    path = str(ckpt_path.resolve())
    for entry in keep.parent.iterdir():
        if entry == keep or entry.name.startswith("."):
            continue
        try:
            if read_metadata(entry).get("checkpoint") == path:
                _move_aside(entry)
        except CheckpointError:
            continue  # not a conversion: not ours to remove


def _converts(cache: Path, digest: str) -> bool:
    """Whether `cache` is a whole conversion of the checkpoint whose SHA-256 is `digest`."""
    try:
        return cache.is_dir() and read_metadata(cache).get("checkpoint_sha256") == digest
    except CheckpointError:
        return False


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """`aiayn.json` of an exported directory; CheckpointError if it is not one."""
    path = Path(directory) / METADATA
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a CTranslate2 export of aiayn (no {METADATA}); write one with "
            "python -m aiayn.export ckpt_path=<ckpt> output_dir=<dir>"
        )
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{path} is not a valid {METADATA} ({error}); export the checkpoint again"
        ) from None
    if not isinstance(metadata, dict) or metadata.get("format_version") != FORMAT_VERSION:
        metadata = metadata if isinstance(metadata, dict) else {}
        raise CheckpointError(
            f"{path}: format_version {metadata.get('format_version')!r} is not "
            f"{FORMAT_VERSION}; export the checkpoint again"
        )
    return metadata
