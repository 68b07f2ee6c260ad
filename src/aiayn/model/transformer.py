"""Encoder, Decoder and the encoder-decoder ``Transformer``.

Shapes: ``src (B, S)``, ``tgt_in (B, T)`` token ids; ``memory (B, S, D)``; ``logits (B, T, V)``.
``src_mask``/``tgt_mask`` are key-padding masks ``(B, S)``/``(B, T)``, bool, True = real token
(``aiayn.model.masks``); when None they are derived from ``config.pad_id`` (except in
``decode``, which cannot see the source tokens: there None means "no source padding").
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.model.attention import MultiHeadCrossAttention, MultiHeadSelfAttention
from aiayn.model.cache import KVCache, LayerCache
from aiayn.model.config import ModelConfig
from aiayn.model.embedding import (
    Embedding,
    LearnedPositionalEmbedding,
    OutputProjection,
    TokenEmbedding,
)
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.masks import attention_mask, causal_mask, padding_mask


class Encoder(nn.Module):
    """A stack of ``EncoderLayer`` (+ final LayerNorm when pre-norm): ``(B, S, D)`` -> same."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_encoder_layers))
        self.norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()

    def forward(
        self, x: Tensor, mask: Tensor | None = None, weights: list[Tensor] | None = None
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask, weights)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of ``DecoderLayer`` (+ final LayerNorm when pre-norm): ``(B, T, D)`` -> same."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_decoder_layers))
        self.norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Tensor | None = None,
        is_causal: bool = False,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
        self_weights: list[Tensor] | None = None,
        cross_weights: list[Tensor] | None = None,
    ) -> Tensor:
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            x = layer(
                x,
                memory,
                self_mask,
                is_causal,
                memory_mask,
                layer_cache,
                self_weights,
                cross_weights,
            )
        return self.norm(x)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Modules: ``src_embed``, ``tgt_embed`` (token embedding x sqrt(d) + positions, dropout),
    ``encoder``, ``decoder``, ``output`` (projection to the target vocabulary, tied to the
    target embedding unless ``share_embeddings='none'``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        d, e = config.d_model, config.d_embed
        src_token = TokenEmbedding(config.src_vocab_size, d, e)
        if config.share_embeddings == "all":
            tgt_token = src_token
        else:
            tgt_token = TokenEmbedding(config.tgt_vocab_size, d, e)

        def embedding(token: TokenEmbedding) -> Embedding:
            return Embedding(token, d, config.max_positions, config.positional, config.dropout)

        self.src_embed = embedding(src_token)
        self.tgt_embed = embedding(tgt_token)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.output = OutputProjection(d, config.tgt_vocab_size, e)
        if config.share_embeddings != "none":
            self.output.weight = tgt_token.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights (fused q/k/v per block), zero biases, embeddings and
        untied output matrix ``N(0, width^-0.5)``, LayerNorm (1, 0)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        custom = (
            MultiHeadSelfAttention,
            MultiHeadCrossAttention,
            TokenEmbedding,
            LearnedPositionalEmbedding,
        )
        for module in self.modules():
            if isinstance(module, custom):
                module.reset_parameters()
        if self.config.share_embeddings == "none":
            self.output.reset_parameters()

    # -- masks -----------------------------------------------------------------------------

    def _key_mask(self, tokens: Tensor | None, mask: Tensor | None) -> Tensor | None:
        """Key-padding mask ``(B, L)`` given or derived from ``pad_id``; None if nothing is padded
        (lets attention take the fastest kernels)."""
        if mask is None:
            if tokens is None:
                return None
            mask = padding_mask(tokens, self.config.pad_id)
        return None if bool(mask.all()) else mask

    # -- encoder / decoder ------------------------------------------------------------------

    def _encode(
        self, src: Tensor, key_mask: Tensor | None, weights: list[Tensor] | None = None
    ) -> Tensor:
        return self.encoder(self.src_embed(src), attention_mask(key_mask), weights)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (B, S)``, ``src_mask (B, S)`` (True = real) -> ``memory (B, S, D)``."""
        return self._encode(src, self._key_mask(src, src_mask))

    def _decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        src_key_mask: Tensor | None,
        tgt_key_mask: Tensor | None,
        cache: KVCache | None = None,
        self_weights: list[Tensor] | None = None,
        cross_weights: list[Tensor] | None = None,
    ) -> Tensor:
        T = tgt_in.size(1)
        if cache is None:
            offset, memory_mask = 0, attention_mask(src_key_mask)
            if memory is None:
                raise ValueError("decode needs memory when no cache is given")
        else:
            offset, memory_mask = cache.length, cache.memory_mask
        self_mask, is_causal = None, False
        if tgt_key_mask is not None:
            causal = causal_mask(T, offset=offset, device=tgt_in.device)
            self_mask = attention_mask(tgt_key_mask, causal)
        elif offset == 0:
            is_causal = T > 1
        elif T > 1:
            self_mask = causal_mask(T, offset=offset, device=tgt_in.device)[None, None]
        x = self.tgt_embed(tgt_in, offset)
        x = self.decoder(
            x, memory, self_mask, is_causal, memory_mask, cache, self_weights, cross_weights
        )
        return self.output(x)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``tgt_in (B, T)``, ``memory (B, S, D)`` -> ``logits (B, T, V)``.

        ``src_mask (B, S)``: source key-padding mask (None = no source padding). ``tgt_mask
        (B, T)``: target key-padding mask (None = derived from ``pad_id``).

        With ``cache`` (from ``init_cache``): ``tgt_in`` holds only the new tokens, whose
        positions continue from ``cache.length``; ``memory`` and ``src_mask`` are ignored (the
        cache holds them) and the new tokens are taken as real (``tgt_mask`` must be None; no
        padding is derived). The cache is updated in place; the logits of the last new token
        are ``logits[:, -1]``.
        """
        if cache is None:
            return self._decode(
                tgt_in, memory, self._key_mask(None, src_mask), self._key_mask(tgt_in, tgt_mask)
            )
        if tgt_mask is not None:
            raise ValueError("decode with a cache takes no tgt_mask: new tokens must be real")
        if tgt_in.size(0) != cache.batch_size:
            raise ValueError(
                f"tgt_in has batch size {tgt_in.size(0)} but the cache {cache.batch_size}"
            )
        return self._decode(tgt_in, None, None, None, cache)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """``src (B, S)``, ``tgt_in (B, T)`` (teacher forcing, starts with BOS) ->
        ``logits (B, T, V)``; masks ``(B, S)``/``(B, T)`` True = real, default from ``pad_id``."""
        src_key = self._key_mask(src, src_mask)
        memory = self._encode(src, src_key)
        return self._decode(tgt_in, memory, src_key, self._key_mask(tgt_in, tgt_mask))

    # -- incremental decoding ---------------------------------------------------------------

    def init_cache(self, memory: Tensor, src_mask: Tensor | None = None) -> KVCache:
        """A fresh ``KVCache`` for ``memory (B, S, D)`` with source key-padding ``src_mask
        (B, S)`` (None = no padding): cross-attention keys/values computed here, once."""
        layers = [
            LayerCache(*layer.cross_attn.project_memory(memory)) for layer in self.decoder.layers
        ]
        return KVCache(layers, attention_mask(self._key_mask(None, src_mask)))

    # -- visualisation ----------------------------------------------------------------------

    def attention_maps(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> dict[str, list[Tensor]]:
        """Per-layer attention probabilities (explicit attention path; same outputs as forward).

        Returns ``{'encoder_self': [(B, H, S, S)] * N_enc, 'decoder_self': [(B, H, T, T)] *
        N_dec, 'decoder_cross': [(B, H, T, S)] * N_dec}``; each row sums to 1 over the visible
        keys and is 0 on masked keys (rows of padding queries with no visible key are uniform).
        Call under ``torch.no_grad()`` when only looking.
        """
        maps: dict[str, list[Tensor]] = {
            "encoder_self": [],
            "decoder_self": [],
            "decoder_cross": [],
        }
        self._forward_with_maps(src, tgt_in, src_mask, tgt_mask, maps)
        return maps

    def _forward_with_maps(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        maps: dict[str, list[Tensor]],
    ) -> Tensor:
        """``forward`` through the explicit attention path, filling ``maps``; returns logits."""
        src_key = self._key_mask(src, src_mask)
        memory = self._encode(src, src_key, maps["encoder_self"])
        tgt_key = self._key_mask(tgt_in, tgt_mask)
        return self._decode(
            tgt_in, memory, src_key, tgt_key, None, maps["decoder_self"], maps["decoder_cross"]
        )
