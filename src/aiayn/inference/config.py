"""The schemas of the commands that decode with a checkpoint: `translate` (`TranslateConfig`,
conf/translate.yaml), `evaluate` (`EvalConfig`, conf/eval.yaml), both on the fields of
`DecodingJobConfig`, and `visualize` (`VisualizeConfig`, conf/visualize.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from aiayn.data.config import ROLES, DataConfig
from aiayn.errors import ConfigError
from aiayn.inference.ct2 import COMPUTE_TYPES, ENGINES, check_threads
from aiayn.inference.translator import ON_LONG
from aiayn.schema import DecodeOverrides, PathsConfig

EVAL_MODES = ("translate", "score")


@dataclass
class DecodingJobConfig:
    """What `translate` and `evaluate` share: the checkpoint(s), the decode settings on top of
    its own, batching, the device and the engine; `__post_init__` checks them by key."""

    ckpt_path: Any = None  # a checkpoint, or a list of them: an ensemble ([a.ckpt,b.ckpt])
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)  # on the checkpoint's
    batch_size: int = 32  # lines per batch (1 when translate reads a terminal)
    on_long: str = "truncate"
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda:1', ...
    # weights for engine=torch: auto (bfloat16 on bf16 GPUs, float16 on older, float32 on CPU)
    dtype: str = "auto"
    # torch, or ctranslate2: the checkpoint's CTranslate2 conversion (made once, cached outside
    # the run: aiayn.export.ctranslate2.conversion_cache) or ct2_path (pip install -e ".[export]")
    engine: str = "torch"
    ct2_path: Optional[str] = None  # noqa: UP045 (default: the checkpoint's cached conversion)
    ct2_compute_type: str = "default"  # 'int8' quantizes on load
    ct2_inter_threads: int = 0  # CTranslate2 replicas (0: one per CPU thread; 1 on a GPU)
    ct2_intra_threads: int = 0  # threads per replica (0: the CPU threads left, often 1)
    progress: bool = True  # a progress bar on standard error (on a terminal only)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def __post_init__(self) -> None:
        if not self.ckpt_path and not (self.engine == "ctranslate2" and self.ct2_path):
            raise ConfigError(
                "ckpt_path is required: ckpt_path=logs/train/runs/<ts>/checkpoints/best.ckpt "
                "(or engine=ctranslate2 ct2_path=<exported dir>)"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if isinstance(self.ckpt_path, (list, tuple)) and (
            not self.ckpt_path or self.engine != "torch" or self.ct2_path
        ):
            raise ConfigError(
                "ckpt_path=[a.ckpt,b.ckpt,...] (an ensemble) needs at least one checkpoint and "
                "decodes with engine=torch"
            )
        if self.ct2_path and self.engine != "ctranslate2":
            raise ConfigError("ct2_path is a CTranslate2 export: add engine=ctranslate2")
        if self.ct2_compute_type not in COMPUTE_TYPES:
            raise ConfigError(
                f"ct2_compute_type must be one of {COMPUTE_TYPES}, got {self.ct2_compute_type!r}"
            )
        check_threads(self.ct2_inter_threads, self.ct2_intra_threads)
        self.decode.check()
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be a positive integer, got {self.batch_size}")
        if self.on_long not in ON_LONG:
            raise ConfigError(f"on_long must be one of {ON_LONG}, got {self.on_long!r}")


@dataclass
class TranslateConfig(DecodingJobConfig):
    """Everything `aiayn translate` reads (conf/translate.yaml)."""

    input: str = "-"  # a text file, or '-' for standard input
    output: str = "-"  # a text file, or '-' for standard output
    tokenizer: Optional[str] = None  # noqa: UP045 (default: the checkpoint's own)
    # a text file with one target prefix per input line, forced at the start of its output
    prefix_file: Optional[str] = None  # noqa: UP045
    task_name: str = "translate"


@dataclass
class EvalConfig(DecodingJobConfig):
    """Everything `aiayn evaluate` reads (conf/eval.yaml)."""

    batch_size: int = 64
    data: Optional[DataConfig] = None  # noqa: UP045 (None: the checkpoint's run's data)
    split: str = "test"
    # translate: decode and score BLEU; score: each reference's NLL given its source
    # (scores.<split>.tsv, score.json), as fairseq's --score-reference
    mode: str = "translate"
    # also bleu_tok: BLEU on lowercased Moses-tokenized text (as papers score Multi30k)
    tok_bleu: bool = False
    task_name: str = "eval"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.split not in ROLES:
            raise ConfigError(f"split must be one of {ROLES}, got {self.split!r}")
        if self.mode not in EVAL_MODES:
            raise ConfigError(f"mode must be one of {EVAL_MODES}, got {self.mode!r}")
        if self.mode == "score" and self.engine != "torch":
            raise ConfigError("mode=score runs the PyTorch model: drop engine=ctranslate2")


@dataclass
class VisualizeConfig:
    """Everything `aiayn visualize` reads (conf/visualize.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    sentence: Optional[str] = None  # noqa: UP045
    target: Optional[str] = None  # noqa: UP045 (None: the model's own translation)
    output_dir: str = "attention"
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)  # on the checkpoint's
    device: str = "cpu"
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "visualize"

    def __post_init__(self) -> None:
        if not self.ckpt_path or not self.sentence:
            raise ConfigError(
                'ckpt_path and sentence are required: ckpt_path=<ckpt> sentence="..."'
            )
        self.decode.check()
