"""`ModelConfig`: the Transformer's hyper-parameters. Field names are the Hydra keys users
type (`model.num_heads=4`), so they are a public contract: add fields, never rename them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ACTIVATIONS = ("relu", "gelu")
POSITIONALS = ("sinusoidal", "learned")
SHARE_EMBEDDINGS = ("none", "decoder", "all")
ARCHS = ("transformer", "rnn")
# settings only the Transformer has: arch='rnn' refuses them away from their defaults
TRANSFORMER_ONLY = {
    "norm_first": False,
    "final_norm": None,
    "head_dim": None,
    "positional": "sinusoidal",
    "embedding_norm": False,
    "activation_dropout": 0.0,
    "shared_head_qkv": False,
    "dropout_after_norm": False,
    "linear_bias": True,
    "norm_bias": True,
}


@dataclass
class ModelConfig:
    """Hyper-parameters of the encoder-decoder Transformer (defaults: the paper's base model).

    share_embeddings: 'none' (three matrices), 'decoder' (target embedding = output
    projection) or 'all' (source, target and output projection share one matrix; needs
    equal vocabulary sizes). d_embed: optional factorized embedding size, projected to d_model.
    pad_id, bos_id, eos_id: the special token ids (distinct, inside both vocabularies).

    arch: 'transformer' (this model) or 'rnn', the attention-LSTM baseline
    (`aiayn.model.rnn.AttentionLSTM`): d_model is then its width, num_encoder_layers /
    num_decoder_layers its LSTM depths, and the embedding and output settings apply as they
    are; num_heads, d_ff, activation and attention_dropout are not used, and the settings in
    TRANSFORMER_ONLY must keep their defaults.
    """

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    positional: str = "sinusoidal"
    max_positions: int = 1024
    share_embeddings: str = "all"
    d_embed: Optional[int] = None  # noqa: UP045 (OmegaConf structured configs need Optional)
    # d_k = d_v per head; None: d_model / num_heads. Set, the attention width num_heads *
    # head_dim may differ from d_model (Table 3 row (B): smaller keys at fixed heads)
    head_dim: Optional[int] = None  # noqa: UP045
    # a LayerNorm after each stack: None = only when pre-norm (the paper); True on post-norm
    # stacks too = torch.nn.Transformer's default
    final_norm: Optional[bool] = None  # noqa: UP045
    # dropout on the FFN's hidden activation (torch.nn.Transformer: = dropout; fairseq
    # --activation-dropout); 0 = none (the paper)
    activation_dropout: float = 0.0
    # token embeddings times sqrt(width) (the paper); false: added to the positions as looked
    # up (seed 004), and drawn from N(0, 1) so the embedded tokens keep unit scale
    scale_embeddings: bool = True
    # a bias on the output layer (the seed notebooks' nn.Linear heads; fairseq has none)
    output_bias: bool = False
    # dropout on the embedding sum; null: `dropout` (seed 001 uses none there, 0.2 in blocks)
    embedding_dropout: Optional[float] = None  # noqa: UP045
    # a LayerNorm on the embedding sum (token + position), before its dropout (seed 002)
    embedding_norm: bool = False
    # factorized embeddings (d_embed): a bias on the d_embed -> d_model projection, and the
    # sqrt(d_model) scaling after projecting instead of sqrt(d_embed) before (seed 002)
    embedding_proj_bias: bool = False
    embedding_scale_after_proj: bool = False
    # factorized embeddings: the output layer projects d_model -> d_embed -> V (true), or is a
    # direct d_model -> V matrix (false; needs share_embeddings='none'; seed 002)
    factorized_output: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    # fields added later come last, so that positional construction keeps its meaning
    # 'transformer' or 'rnn' (the LSTM baseline, see the class docstring)
    arch: str = "transformer"
    # Q, K and V each one (d_k, d_k) matrix without bias, shared by the heads and applied to
    # each head's d_k slice of the input (seed 001), instead of full (d_model, A) projections
    shared_head_qkv: bool = False
    # post-norm sub-layers as LayerNorm(x + Sublayer(x)) then dropout (seed 001), instead of
    # the paper's dropout on the sub-layer output before the residual sum
    dropout_after_norm: bool = False
    # the token embeddings' (and a tied output layer's) initial std; null: 1 / sqrt(width)
    # with scale_embeddings (unit-scale embedded tokens), 1 without. Smaller starts the
    # shared matrix near Sockeye's Xavier draw (about 0.016 at 8k x 256)
    embedding_init_std: Optional[float] = None  # noqa: UP045
    # biases on the layers' linear maps: every attention's Q/K/V and output projections and
    # the FFN's two layers (false: OpenNMT-py's and eole's default, add_qkvbias/add_ffnbias)
    linear_bias: bool = True
    # a bias (beta) on every LayerNorm; false with linear_bias false: torch.nn.Transformer's
    # bias=False (and nanoGPT's)
    norm_bias: bool = True

    def __post_init__(self) -> None:
        self.validate()

    @property
    def has_final_norm(self) -> bool:
        """Whether each stack ends in a LayerNorm (`final_norm`, default: when pre-norm)."""
        return self.norm_first if self.final_norm is None else bool(self.final_norm)

    def validate(self) -> None:
        """Raise ValueError naming the offending field(s) and what to do."""
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "num_heads",
            "num_encoder_layers",
            "num_decoder_layers",
            "d_ff",
            "max_positions",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.d_embed is not None and (
            not isinstance(self.d_embed, int) or isinstance(self.d_embed, bool) or self.d_embed <= 0
        ):
            raise ValueError(
                f"ModelConfig.d_embed must be a positive integer or null, got {self.d_embed!r}"
            )
        if not 0.0 <= self.activation_dropout < 1.0:
            raise ValueError(
                f"ModelConfig.activation_dropout must lie in [0, 1), got {self.activation_dropout}"
            )
        if self.head_dim is not None and (
            not isinstance(self.head_dim, int)
            or isinstance(self.head_dim, bool)
            or self.head_dim <= 0
        ):
            raise ValueError(
                f"ModelConfig.head_dim must be a positive integer or null, got {self.head_dim!r}"
            )
        if self.arch == "transformer" and self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} is not divisible by "
                f"ModelConfig.num_heads={self.num_heads}; choose num_heads dividing d_model "
                "or set ModelConfig.head_dim"
            )
        std = self.embedding_init_std
        if std is not None and (
            not isinstance(std, (int, float)) or isinstance(std, bool) or not std > 0
        ):
            raise ValueError(
                f"ModelConfig.embedding_init_std must be a positive number or null, got {std!r}"
            )
        for name in ("dropout", "attention_dropout", "embedding_dropout"):
            value = getattr(self, name)
            if name == "embedding_dropout" and value is None:
                continue
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"ModelConfig.{name} must lie in [0, 1), got {value!r}")
        if (
            self.shared_head_qkv
            and (self.head_dim or self.d_model // self.num_heads) * (self.num_heads) != self.d_model
        ):
            raise ValueError(
                "ModelConfig.shared_head_qkv splits d_model into the heads: it needs "
                f"num_heads * head_dim = d_model (got {self.num_heads} x {self.head_dim} for "
                f"d_model={self.d_model}); drop head_dim"
            )
        if self.dropout_after_norm and self.norm_first:
            raise ValueError(
                "ModelConfig.dropout_after_norm applies to post-norm sub-layers: it cannot be "
                "combined with norm_first=true"
            )
        if self.arch not in ARCHS:
            raise ValueError(f"ModelConfig.arch={self.arch!r} is unknown; use one of {ARCHS}")
        if self.arch == "rnn":
            self._validate_rnn()
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"ModelConfig.activation={self.activation!r} is unknown; use one of {ACTIVATIONS}"
            )
        if self.positional not in POSITIONALS:
            raise ValueError(
                f"ModelConfig.positional={self.positional!r} is unknown; use one of {POSITIONALS}"
            )
        if self.share_embeddings not in SHARE_EMBEDDINGS:
            raise ValueError(
                f"ModelConfig.share_embeddings={self.share_embeddings!r} is unknown; "
                f"use one of {SHARE_EMBEDDINGS}"
            )
        for name in ("embedding_proj_bias", "embedding_scale_after_proj"):
            if getattr(self, name) and self.d_embed is None:
                raise ValueError(
                    f"ModelConfig.{name} needs a factorized embedding: set ModelConfig.d_embed"
                )
        factorized, tied = self.d_embed is not None, self.share_embeddings != "none"
        if factorized and not self.factorized_output and tied:
            raise ValueError(
                "ModelConfig.factorized_output=false (a direct d_model -> V output layer) "
                "cannot be tied to the d_embed-wide embeddings: set "
                f"share_embeddings='none' (got {self.share_embeddings!r})"
            )
        if self.share_embeddings == "all" and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "ModelConfig.share_embeddings='all' needs equal vocabularies, got "
                f"src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}; "
                "use a joint tokenizer or share_embeddings='decoder'/'none'"
            )
        vocab = min(self.src_vocab_size, self.tgt_vocab_size)
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
                raise ValueError(
                    f"ModelConfig.{name}={value!r} must be a token id inside both vocabularies"
                )
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise ValueError(
                f"ModelConfig.pad_id={self.pad_id}, ModelConfig.bos_id={self.bos_id} and "
                f"ModelConfig.eos_id={self.eos_id} must be distinct"
            )

    def _validate_rnn(self) -> None:
        if self.d_model % 2:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be even for arch='rnn' (the "
                "bidirectional encoder gives each direction half of it)"
            )
        for name, default in TRANSFORMER_ONLY.items():
            if getattr(self, name) != default:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r} is a Transformer setting that "
                    f"arch='rnn' does not have: drop it (default {default!r})"
                )
