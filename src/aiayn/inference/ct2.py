"""`CT2Translator`: a `Translator` whose decoding runs in CTranslate2 (`engine=ctranslate2`).

Everything around decoding (tokenizing, length limits, blank lines, length-sorted batches) is
the PyTorch `Translator`'s, so both engines read and write the same lines. Greedy decoding
gives the same tokens as the PyTorch decoder (tested), up to float rounding; beam search
differs in one documented way: CTranslate2 normalises a hypothesis' score by
`length ** length_penalty`, not by GNMT's `((5 + length) / 6) ** length_penalty`.

Threads on the CPU: by default one translator replica per core (`inter_threads`), each on one
thread (`intra_threads`), and each batch split among them. CTranslate2's own default, one
replica with several OpenMP threads, synchronises its threads after every small product of a
decoding step, so that two threads decode slower than one, where two one-thread replicas
decode faster (`benchmarks/decode_speed.py`, recorded in `benchmarks/RESULTS.md`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import CheckpointError, ConfigError
from aiayn.export.ctranslate2 import (
    METADATA,
    MODEL_FILE,
    ctranslate2_module,
    file_digest,
    model_variables,
    read_metadata,
    vocabulary,
)
from aiayn.inference.checkpoint import check_cuda
from aiayn.inference.translator import Translator, check_beam, decode_config
from aiayn.model import DecodeConfig, Hypothesis, ModelConfig
from aiayn.model.generate import max_output_lengths

ENGINES = ("torch", "ctranslate2")
COMPUTE_TYPES = ("default", "auto", "float32", "int8", "int8_float32", "int8_float16")
COMPUTE_TYPES += ("int8_bfloat16", "int16", "float16", "bfloat16")


def check_threads(inter: int, intra: int) -> None:
    """ConfigError, naming the key, for a negative thread count."""
    for key, value in (("ct2_inter_threads", inter), ("ct2_intra_threads", intra)):
        if value < 0:
            raise ConfigError(f"{key} must be >= 0 (0: choose), got {value}")


def thread_split(device: str, inter: int = 0, intra: int = 0) -> tuple[int, int]:
    """`(inter_threads, intra_threads)` for a CTranslate2 translator on `device` ('cpu' or
    'cuda'); 0 means "choose". On the CPU the threads this process may use
    (`torch.get_num_threads()`, which follows `OMP_NUM_THREADS`) are shared out: by default one
    single-threaded replica per thread; a given count takes its share of the rest. On a GPU:
    one replica, and CTranslate2's default for its CPU-side threads."""
    check_threads(inter, intra)
    if device == "cuda":
        return inter or 1, intra
    threads = torch.get_num_threads()
    if not inter:
        inter = max(1, threads // (intra or 1))
    return inter, intra or max(1, threads // inter)


def sub_batch_size(rows: int, inter_threads: int) -> int:
    """The `max_batch_size` that splits a batch of `rows` among `inter_threads` replicas (0:
    the whole batch at once, for one replica)."""
    return math.ceil(rows / inter_threads) if inter_threads > 1 else 0


class CT2Translator(Translator):
    """Translate with the CTranslate2 model in `directory` (an export: see
    `aiayn.export.ctranslate2`), on `device` ('cpu', 'cuda' or 'auto'), computing in
    `compute_type` ('default': as exported; 'int8' quantizes a float32 export on load), with
    `inter_threads` replicas of `intra_threads` threads each (0: chosen by `thread_split`)."""

    def __init__(
        self,
        directory: str | Path,
        device: str = "cpu",
        compute_type: str = "default",
        decode: DecodeConfig | None = None,
        on_long: str = "truncate",
        engine: Any = None,
        inter_threads: int = 0,
        intra_threads: int = 0,
    ) -> None:
        ctranslate2 = ctranslate2_module()
        if compute_type not in COMPUTE_TYPES:
            raise ConfigError(
                f"ct2_compute_type must be one of {COMPUTE_TYPES}, got {compute_type!r}"
            )
        metadata = read_metadata(directory)
        self.directory, self.metadata = Path(directory), metadata
        self.config = _model_config(self.directory, metadata)
        if engine is None:
            check_model_file(self.directory, metadata)
        self.tokenizers = Tokenizers.load(directory)
        if engine is None:
            check_export(self.directory, self.config, self.tokenizers)
        ct2_device = _device(device)
        if engine is None and ct2_device == "cuda":
            check_cuda(ct2_device, ctranslate2.get_cuda_device_count())
        if ct2_device == "auto":
            ct2_device = "cuda" if ctranslate2.get_cuda_device_count() else "cpu"
        self.inter_threads, self.intra_threads = thread_split(
            ct2_device, inter_threads, intra_threads
        )
        self.engine = engine or ctranslate2.Translator(
            str(directory),
            device=ct2_device,
            compute_type=compute_type,
            inter_threads=self.inter_threads,
            intra_threads=self.intra_threads,
        )
        self.compute_type, self.ct2_device = compute_type, device
        self.decode = decode or DecodeConfig(**metadata["decode"])
        super().__init__(None, self.tokenizers, self.decode, on_long)  # type: ignore[arg-type]
        self.src_tokens = vocabulary(self.tokenizers, "src")
        self.tgt_tokens = vocabulary(self.tokenizers, "tgt")
        self.tgt_ids = {token: i for i, token in enumerate(self.tgt_tokens)}

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # token ids stay on the CPU; CTranslate2 owns its device

    def with_settings(
        self, decode: dict[str, Any] | None = None, on_long: str | None = None
    ) -> CT2Translator:
        """A translator on the same loaded engine with `decode` keys on top of this one's."""
        settings = decode_config(self.decode, decode or {})
        check_beam(settings, self.tokenizers.tgt_vocab_size)
        return CT2Translator(
            self.directory,
            self.ct2_device,
            self.compute_type,
            settings,
            on_long or self.on_long,
            engine=self.engine,
            inter_threads=self.inter_threads,
            intra_threads=self.intra_threads,
        )

    def generate(
        self,
        src: Tensor,
        decode: DecodeConfig | None = None,
        prefix: list[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        """`src (B, S)` token ids (x + EOS, padded) -> n-best hypotheses per row; `prefix`:
        target ids each row's output must start with ([] for none)."""
        config = decode or self.decode
        pad = self.config.pad_id
        rows = [[int(i) for i in row if i != pad] for row in src.tolist()]
        limits = max_output_lengths([len(r) for r in rows], config, self.max_positions)
        options: dict[str, Any] = {}
        if prefix is not None:  # room for the prefix and one more token, as aiayn's search
            limits = [
                min(max(n, len(p) + 1), self.max_positions)
                for n, p in zip(limits, prefix, strict=True)
            ]
            options["target_prefix"] = [[self.tgt_tokens[i] for i in p] for p in prefix]
        beam = config.beam_size if config.strategy == "beam" else 1
        if config.strategy == "sample":
            ctranslate2_module().set_random_seed(config.seed)
            options |= {
                "sampling_topk": config.top_k,  # 0: the whole vocabulary, as aiayn
                "sampling_topp": config.top_p,
                "sampling_temperature": config.temperature,
            }
        try:
            results = self.engine.translate_batch(
                [[self.src_tokens[i] for i in row] for row in rows],
                beam_size=beam,
                num_hypotheses=config.nbest if config.strategy == "beam" else 1,
                length_penalty=config.length_penalty,
                max_input_length=0,
                max_decoding_length=max(limits),
                min_decoding_length=0,
                max_batch_size=sub_batch_size(len(rows), self.inter_threads),
                return_scores=True,
                **options,
            )
        except RuntimeError as error:
            raise _library_error(error, self.ct2_device) from None
        out = []
        for result, limit in zip(results, limits, strict=True):
            hyps = []
            for tokens, score in zip(result.hypotheses, result.scores, strict=True):
                ids = [self.tgt_ids[t] for t in tokens][:limit]
                hyps.append(Hypothesis(ids, float(score)))
            out.append(hyps)
        return out


def _model_config(directory: Path, metadata: dict[str, Any]) -> ModelConfig:
    """The export's `ModelConfig`, or a CheckpointError naming the file and what is wrong."""
    try:
        return ModelConfig(**metadata["model"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{directory / METADATA}: its model settings are not aiayn's ({error}); export the "
            "checkpoint again"
        ) from None


def check_model_file(directory: Path, metadata: dict[str, Any]) -> None:
    """The export's `model.bin` is there and is the one its metadata was written with (the
    SHA-256 an export records: another checkpoint's model would decode without an error)."""
    model = directory / MODEL_FILE
    if not model.is_file():
        raise CheckpointError(f"{model} is missing: export the checkpoint again")
    expected = metadata.get("model_sha256")  # exports before it recorded none
    if expected is not None and file_digest(model) != expected:
        raise CheckpointError(
            f"{model} is not the model {METADATA} describes (its SHA-256 differs: another "
            "export's?); export the checkpoint again"
        )


def check_export(directory: Path, config: ModelConfig, tokenizers: Tokenizers) -> None:
    """Without a digest too: the shapes in `model.bin` are those `aiayn.json`'s model settings
    give, its vocabulary sizes are the tokenizer's, and CTranslate2's vocabulary files list the
    tokenizer's tokens; CheckpointError naming what differs."""
    variables = model_variables(directory / MODEL_FILE)
    source, target = vocabulary(tokenizers, "src"), vocabulary(tokenizers, "tgt")

    def shape(name: str, axis: int) -> Any:
        value = variables.get(name)
        return value[axis] if isinstance(value, tuple) and len(value) > axis else None

    def layers(side: str) -> int:
        return len({n.split("/")[1] for n in variables if n.startswith(f"{side}/layer_")})

    found = {  # what aiayn.json says -> what model.bin holds
        "src_vocab_size": shape("encoder/embeddings_0/weight", 0),
        "tgt_vocab_size": shape("decoder/projection/weight", 0),
        "d_model": shape("decoder/embeddings/weight", 1),
        "d_ff": shape("encoder/layer_0/ffn/linear_0/weight", 0),
        "num_encoder_layers": layers("encoder"),
        "num_decoder_layers": layers("decoder"),
        "num_heads": variables.get("encoder/num_heads"),
        "max_positions": shape("decoder/position_encodings/encodings", 0),
    }
    for key, held in found.items():
        expected = getattr(config, key)
        if held is not None and held != expected:
            raise CheckpointError(
                f"{directory / MODEL_FILE} does not fit {METADATA}: it holds {key} {held}, "
                f"{METADATA} says {expected} (another export's model?); export the checkpoint "
                "again"
            )
    for side, tokens, key in (("source", source, "src"), ("target", target, "tgt")):
        size = getattr(config, f"{key}_vocab_size")
        if len(tokens) != size:
            raise CheckpointError(
                f"{directory}: the {side} tokenizer has {len(tokens)} tokens but the model "
                f"{size} (another export's tokenizer?); export the checkpoint again"
            )
        written = _vocabulary_file(directory, side)
        if written is not None and written != tokens:
            raise CheckpointError(
                f"{directory}: the {side} tokenizer's tokens are not the vocabulary model.bin "
                "was exported with (another export's tokenizer?); export the checkpoint again"
            )


def _vocabulary_file(directory: Path, side: str) -> list[str] | None:
    """The tokens CTranslate2 saved for `side` ('source' or 'target'), or None if absent."""
    import json

    for name in (f"{side}_vocabulary.json", "shared_vocabulary.json"):
        path = directory / name
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                raise CheckpointError(
                    f"{path} is not valid JSON; export the checkpoint again"
                ) from None
    return None


def _library_error(error: RuntimeError, device: str) -> Exception:
    """A CUDA library that CTranslate2 loads on first use and cannot find (its PyPI wheels link
    CUDA 12's cuBLAS; a machine with only CUDA 13's has none) as a ConfigError saying what to
    do; any other error as it came."""
    if "cannot be loaded" not in str(error):
        return error
    import ctranslate2

    return ConfigError(
        f"engine=ctranslate2 on device={device!r}: {error} (CTranslate2 "
        f"{ctranslate2.__version__} needs the CUDA libraries it was built against). Install "
        "them (for CUDA 12: pip install nvidia-cublas-cu12), or decode with device=cpu or "
        "engine=torch"
    )


def _device(device: str) -> str:
    if device in ("auto", "cpu", "cuda"):
        return device
    raise ConfigError(f"device={device!r}: engine=ctranslate2 runs on 'cpu', 'cuda' or 'auto'")


def load_ensemble(
    paths: list[str],
    device: str = "auto",
    tokenizer: str | None = None,
    dtype: str = "float32",
) -> Translator:
    """One `Translator` over an `Ensemble` of the checkpoints (the first one's decode
    settings); they must share the tokenizer (CheckpointError naming the one that differs)."""
    from aiayn.inference.checkpoint import load_checkpoint
    from aiayn.model.ensemble import Ensemble

    members = [load_checkpoint(path, device, tokenizer, dtype) for path in paths]
    first = members[0]
    for path, member in zip(paths[1:], members[1:], strict=True):
        if member.tokenizers.state() != first.tokenizers.state():
            raise CheckpointError(
                f"ensemble: {path} was trained with another tokenizer than {paths[0]}; the "
                "members of an ensemble must share one vocabulary"
            )
    try:
        ensemble = Ensemble([member.model for member in members])
    except ValueError as error:
        raise CheckpointError(f"ensemble of {', '.join(paths)}: {error}") from None
    return Translator(ensemble, first.tokenizers, first.decode)  # type: ignore[arg-type]


def load_translator(
    ckpt_path: str | list[str] | None,
    device: str = "auto",
    tokenizer: str | None = None,
    engine: str = "torch",
    ct2_path: str | None = None,
    ct2_compute_type: str = "default",
    ct2_inter_threads: int = 0,
    ct2_intra_threads: int = 0,
    dtype: str = "float32",
) -> Translator:
    """The translator `translate.py` and `evaluate.py` use: the checkpoint's Transformer
    (`engine=torch`, its weights in `dtype`: `aiayn.inference.checkpoint.resolve_dtype`), or
    CTranslate2 on `ct2_path` or on the checkpoint's cached conversion,
    with `ct2_inter_threads` replicas of `ct2_intra_threads` threads (0: chosen)."""
    from aiayn.export.ctranslate2 import cached_export
    from aiayn.inference.checkpoint import load_checkpoint

    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "torch":
        if ct2_path:
            raise ConfigError("ct2_path is a CTranslate2 model: add engine=ctranslate2")
        if isinstance(ckpt_path, (list, tuple)):
            return load_ensemble(list(ckpt_path), device, tokenizer, dtype)
        return load_checkpoint(ckpt_path, device, tokenizer, dtype)  # type: ignore[arg-type]
    if tokenizer is not None:
        raise ConfigError("tokenizer=... is for engine=torch; an export carries its tokenizer")
    if dtype not in ("auto", "float32"):
        raise ConfigError(
            f"dtype={dtype} is for engine=torch; use ct2_compute_type for CTranslate2"
        )
    directory = Path(ct2_path) if ct2_path else cached_export(ckpt_path)  # type: ignore[arg-type]
    return CT2Translator(
        directory,
        device,
        ct2_compute_type,
        inter_threads=ct2_inter_threads,
        intra_threads=ct2_intra_threads,
    )
