"""Encoder, Decoder and the encoder-decoder ``Transformer``.

Shapes: ``src (B, S)``, ``tgt_in (B, T)`` token ids; ``memory (B, S, D)``; ``logits (B, T, V)``.
``src_mask``/``tgt_mask`` are key-padding masks ``(B, S)``/``(B, T)``, bool, True = real token
(``aiayn.model.masks``). Where the tokens are at hand (``encode``, ``forward``, the target of
``decode``) a None mask is derived from ``config.pad_id``. ``decode`` and ``init_cache`` only
see the ``memory``: they require ``src_mask``, where an explicit None means no source padding.
``tgt_right_padded=True`` (what aiayn's training and scoring pass) promises targets padded on
the right only; the decoder then takes no target mask, as the causal mask already hides the
padding from every real position, and attention keeps its fused causal kernels.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.model.attention import (
    MultiHeadCrossAttention,
    MultiHeadSelfAttention,
    SharedHeadProjection,
    capture_attention,
)
from aiayn.model.cache import KVCache, LayerCache, StaticKVCache
from aiayn.model.config import ModelConfig
from aiayn.model.embedding import (
    Embedding,
    LearnedPositionalEmbedding,
    OutputProjection,
    TokenEmbedding,
    token_embeddings,
)
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.masks import attention_mask, causal_mask, padding_mask


def final_norm(config: ModelConfig) -> nn.Module:
    """A stack's last LayerNorm (``config.has_final_norm``), or an identity."""
    if config.has_final_norm:
        return nn.LayerNorm(config.d_model, bias=config.norm_bias)
    return nn.Identity()


class Encoder(nn.Module):
    """A stack of ``EncoderLayer`` (+ a final LayerNorm: ``config.has_final_norm``):
    ``(B, S, D)`` -> same."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_encoder_layers))
        self.norm = final_norm(config)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """``x (B, S, D)``, ``mask (B|1, 1, 1|S, S)`` -> ``(B, S, D)``."""
        for layer in self.layers:
            x = layer(x, mask=mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of ``DecoderLayer`` (+ a final LayerNorm: ``config.has_final_norm``):
    ``(B, T, D)`` -> same."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_decoder_layers))
        self.norm = final_norm(config)

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        causal: bool = False,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``x (B, T, D)`` -> ``(B, T, D)``; arguments as in ``DecoderLayer.forward``, with
        ``cache`` the whole decoder's (each layer gets its own ``LayerCache``)."""
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                memory=memory,
                self_mask=self_mask,
                causal=causal,
                memory_mask=memory_mask,
                cache=cache.layers[i] if cache is not None else None,
            )
        return self.norm(x)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Modules: ``src_embed``, ``tgt_embed`` (token embedding x sqrt(d) + positions, dropout),
    ``encoder``, ``decoder``, ``output`` (projection to the target vocabulary, tied to the
    target embedding unless ``share_embeddings='none'``).
    """

    # a key mask with no padding is dropped on the CPU (set by aiayn.kernels.accelerate)
    drop_unpadded_masks = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        d, e = config.d_model, config.d_embed
        src_token, tgt_token = token_embeddings(config)
        dropout = config.dropout if config.embedding_dropout is None else config.embedding_dropout

        def embedding(token: TokenEmbedding) -> Embedding:
            positional, norm = config.positional, config.embedding_norm
            norm_bias = config.norm_bias
            return Embedding(token, d, config.max_positions, positional, dropout, norm, norm_bias)

        self.src_embed = embedding(src_token)
        self.tgt_embed = embedding(tgt_token)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        e_out = e if config.factorized_output else None  # direct d_model -> V (seed 002)
        self.output = OutputProjection(d, config.tgt_vocab_size, e_out, config.output_bias)
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
            SharedHeadProjection,
            TokenEmbedding,
            LearnedPositionalEmbedding,
        )
        for module in self.modules():
            if isinstance(module, custom):
                module.reset_parameters()
        if self.config.share_embeddings == "none":
            self.output.reset_parameters()
        elif self.output.bias is not None:
            nn.init.zeros_(self.output.bias)

    # -- masks -----------------------------------------------------------------------------

    def _key_mask(self, tokens: Tensor | None, mask: Tensor | None) -> Tensor | None:
        """Key-padding mask ``(B, L)`` given, or derived from ``pad_id`` when ``tokens`` are
        given; with `drop_unpadded_masks`, None for a CPU mask with no padding (the fastest
        kernels take no mask; on a GPU that check would make the host wait for the device)."""
        if mask is None:
            if tokens is None:
                return None
            mask = padding_mask(tokens, self.config.pad_id)
        if self.drop_unpadded_masks and mask.device.type == "cpu" and bool(mask.all()):
            return None
        return mask

    def _target_key_mask(
        self, tgt_in: Tensor, mask: Tensor | None, right_padded: bool
    ) -> Tensor | None:
        """The decoder's self-attention key mask: given, derived from ``pad_id``, or None for
        right-padded targets without a mask. Under the causal mask a real position of a
        right-padded row attends to real positions only; padded positions, which the loss does
        not read, may attend to padding, and attention keeps its fused causal kernels (no
        (B, T, T) mask)."""
        if mask is None and right_padded:
            return None
        return self._key_mask(tgt_in, mask)

    # -- encoder / decoder ------------------------------------------------------------------

    def _encode(self, src: Tensor, src_key: Tensor | None) -> Tensor:
        return self.encoder(self.src_embed(src), mask=attention_mask(src_key))

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (B, S)``, ``src_mask (B, S)`` (True = real) -> ``memory (B, S, D)``."""
        return self._encode(src, self._key_mask(src, src_mask))

    def _decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_key: Tensor | None,
        tgt_key: Tensor | None,
        features_only: bool = False,
    ) -> Tensor:
        self_mask = None  # no target padding: SDPA's is_causal, the fastest kernels
        if tgt_key is not None:
            self_mask = attention_mask(tgt_key, causal_mask(tgt_in.size(1), device=tgt_in.device))
        x = self.decoder(
            self.tgt_embed(tgt_in),
            memory=memory,
            self_mask=self_mask,
            causal=self_mask is None,
            memory_mask=attention_mask(src_key),
        )
        return x if features_only else self.output(x)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None = None,
        *,
        tgt_right_padded: bool = False,
    ) -> Tensor:
        """Teacher-forced decoder pass: ``tgt_in (B, T)``, ``memory (B, S, D)`` ->
        ``logits (B, T, V)``.

        ``src_mask (B, S)``: the source key-padding mask (True = real). Required, since the
        source tokens are not at hand to derive it: pass None explicitly for a source without
        padding. ``tgt_mask (B, T)``: target key-padding mask (None = derived from ``pad_id``,
        or none at all with ``tgt_right_padded``; see the module docstring).
        """
        src_key = self._key_mask(None, src_mask)
        tgt_key = self._target_key_mask(tgt_in, tgt_mask, tgt_right_padded)
        return self._decode(tgt_in, memory, src_key, tgt_key)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        features_only: bool = False,
        *,
        tgt_right_padded: bool = False,
    ) -> Tensor:
        """``src (B, S)``, ``tgt_in (B, T)`` (teacher forcing, starts with BOS) ->
        ``logits (B, T, V)``; masks ``(B, S)``/``(B, T)`` True = real, default from ``pad_id``.
        The outputs at padded positions are not defined. Positions count from the first
        column, so pad on the right (as `aiayn.data` does) for a row to match its unpadded
        self; ``tgt_right_padded=True`` then skips the target mask (module docstring).
        ``features_only``: the decoder's output ``(B, T, D)`` instead, before ``self.output``
        (as fairseq's; `projected_label_smoothed_loss` applies the output layer itself)."""
        src_key = self._key_mask(src, src_mask)
        memory = self._encode(src, src_key)
        tgt_key = self._target_key_mask(tgt_in, tgt_mask, tgt_right_padded)
        return self._decode(tgt_in, memory, src_key, tgt_key, features_only)

    # -- incremental decoding ---------------------------------------------------------------

    def init_cache(
        self, memory: Tensor, src_mask: Tensor | None, capacity: int | None = None
    ) -> KVCache | StaticKVCache:
        """A fresh ``KVCache`` for ``memory (B, S, D)`` with source key-padding ``src_mask
        (B, S)`` (required, as in ``decode``; None = no source padding): the cross-attention
        keys/values are computed here, once. With ``capacity``, a ``StaticKVCache`` of that
        many positions (fixed buffers and batch: what a CUDA graph of `decode_step` needs)."""
        cross = [layer.cross_attn.project_memory(memory) for layer in self.decoder.layers]
        memory_mask = attention_mask(self._key_mask(None, src_mask))
        if capacity is None:
            return KVCache([LayerCache(k, v) for k, v in cross], memory_mask)
        if not 0 < capacity <= self.config.max_positions:
            raise ValueError(
                f"capacity={capacity} must lie in 1..ModelConfig.max_positions="
                f"{self.config.max_positions}"
            )
        return StaticKVCache(cross, memory_mask, capacity)

    def decode_step(self, tokens: Tensor, cache: KVCache | StaticKVCache) -> Tensor:
        """Incremental decoder pass: ``tokens (B, T_new)`` -> ``logits (B, T_new, V)``.

        ``tokens`` are the next positions, continuing from ``cache.offset``, and are taken as
        real (no padding is derived); the source comes from the cache (``init_cache``), which
        is updated in place. The next-token logits are ``logits[:, -1]``. On a
        ``StaticKVCache`` (one token a step) nothing here reads the device: the step can be
        captured as a CUDA graph; the caller then moves the cache on (``advance``).
        """
        if tokens.size(0) != cache.batch_size:
            raise ValueError(
                f"tokens have batch size {tokens.size(0)} but the cache {cache.batch_size}"
            )
        x = self.decoder(
            self.tgt_embed(tokens, cache.offset),
            self_mask=cache.self_mask(tokens.size(1)),
            memory_mask=cache.memory_mask,
            cache=cache,
        )
        return self.output(x)

    # -- visualisation ----------------------------------------------------------------------

    def attention_maps(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> dict[str, list[Tensor]]:
        """Per-layer attention probabilities of ``forward`` (see ``capture_attention``).

        Returns ``{'encoder_self': [(B, H, S, S)] * N_enc, 'decoder_self': [(B, H, T, T)] *
        N_dec, 'decoder_cross': [(B, H, T, S)] * N_dec}``; each row sums to 1 over the visible
        keys and is 0 on masked keys (rows of padding queries with no visible key are uniform).
        Call under ``torch.no_grad()`` when only looking.
        """
        with capture_attention(self) as maps:
            self(src, tgt_in, src_mask, tgt_mask)
        return maps
