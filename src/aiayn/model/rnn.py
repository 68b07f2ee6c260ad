"""`AttentionLSTM`: the recurrent baseline (``ModelConfig.arch='rnn'``), built on ``nn.LSTM``.

Luong et al. (2015) global attention, "general" score, without input feeding:

- encoder: the source embedding, dropout, a bidirectional LSTM of ``num_encoder_layers``
  layers with ``d_model / 2`` units per direction -> ``memory (B, S, D)``; padded sources are
  packed, so padding changes nothing (sources must be right-padded, as aiayn's batches are);
- bridge: the decoder's initial hidden state per layer is ``tanh(W_b mean(memory))`` over the
  real source positions, its initial cell state zero;
- decoder: the target embedding, dropout, an LSTM of ``num_decoder_layers`` layers of ``D``
  units -> ``h_t``; attention ``a_t = softmax_s(h_t . W_a m_s)`` over the real source
  positions, context ``c_t = sum_s a_t,s m_s``, attentional state ``tanh(W_c [c_t; h_t])``,
  dropout, then the output layer (tied to the target embedding unless
  ``share_embeddings='none'``).

Without input feeding the decoder LSTM reads only the target tokens, so teacher forcing is one
fused LSTM call over the whole target and the attention one batched product: training costs a
few kernels per batch instead of a Python loop over target positions. Incremental decoding
carries the LSTM state (``RNNCache``) and gives exactly the teacher-forced logits.

It has the Transformer's interface (``forward``, ``encode``, ``decode``, ``init_cache``,
``decode_step``, ``attention_maps``), so training, every decoding strategy, ensembles, scoring
and the CLIs use it unchanged. Shapes as in ``aiayn.model.transformer``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from aiayn.model.config import ModelConfig
from aiayn.model.embedding import OutputProjection, token_embeddings
from aiayn.model.masks import padding_mask


def _between(config: ModelConfig, layers: int) -> float:
    """nn.LSTM's dropout between stacked layers (none, and no warning, with one layer)."""
    return config.dropout if layers > 1 else 0.0


class RNNCache:
    """Incremental-decoding state: the decoder LSTM's ``h, c (L, B, D)``, the ``memory
    (B, S, D)``, its attention keys ``W_a memory (B, S, D)`` and ``memory_mask (B, S)`` (True =
    real; None = no padding); ``length`` = target positions read so far."""

    def __init__(
        self, h: Tensor, c: Tensor, memory: Tensor, keys: Tensor, memory_mask: Tensor | None
    ) -> None:
        self.h, self.c = h, c
        self.memory, self.keys, self.memory_mask = memory, keys, memory_mask
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.memory.size(0)

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Keep batch rows ``index (B',)`` in place (see ``KVCache.reorder``)."""
        if not cross and index.numel() != self.batch_size:
            raise ValueError("reorder(cross=False) cannot change the batch size")
        self.h, self.c = self.h.index_select(1, index), self.c.index_select(1, index)
        if cross:
            self.memory = self.memory.index_select(0, index)
            self.keys = self.keys.index_select(0, index)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, index)


class AttentionLSTM(nn.Module):
    """Bidirectional-LSTM encoder, attention-LSTM decoder (see the module docstring).

    Modules: ``src_embed``, ``tgt_embed`` (token embeddings, shared as ``share_embeddings``
    says), ``encoder`` (``nn.LSTM``), ``bridge``, ``decoder`` (``nn.LSTM``), ``attn_key``
    (``W_a``), ``attn_out`` (``W_c``), ``output``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        if config.arch != "rnn":
            raise ValueError(f"AttentionLSTM needs ModelConfig.arch='rnn', got {config.arch!r}")
        self.config = config
        d, e = config.d_model, config.d_embed
        self.src_embed, self.tgt_embed = token_embeddings(config)
        dropout = config.dropout if config.embedding_dropout is None else config.embedding_dropout
        self.embed_dropout = nn.Dropout(dropout)
        enc, dec = config.num_encoder_layers, config.num_decoder_layers
        self.encoder = nn.LSTM(
            d, d // 2, enc, batch_first=True, bidirectional=True, dropout=_between(config, enc)
        )
        self.bridge = nn.Linear(d, dec * d)
        self.decoder = nn.LSTM(d, d, dec, batch_first=True, dropout=_between(config, dec))
        self.attn_key = nn.Linear(d, d, bias=False)
        self.attn_out = nn.Linear(2 * d, d, bias=False)
        self.dropout = nn.Dropout(config.dropout)
        e_out = e if config.factorized_output else None
        self.output = OutputProjection(d, config.tgt_vocab_size, e_out, config.output_bias)
        if config.share_embeddings != "none":
            self.output.weight = self.tgt_embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """LSTMs as torch initialises them (``U(-1/sqrt(H), 1/sqrt(H))``), Xavier-uniform
        linear layers with zero biases, embeddings and an untied output as the Transformer's."""
        self.encoder.reset_parameters()
        self.decoder.reset_parameters()
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.src_embed.reset_parameters()
        self.tgt_embed.reset_parameters()
        if self.config.share_embeddings == "none":
            self.output.reset_parameters()
        elif self.output.bias is not None:
            nn.init.zeros_(self.output.bias)

    # -- encoder ----------------------------------------------------------------------------

    def _key_mask(self, tokens: Tensor | None, mask: Tensor | None) -> Tensor | None:
        """The source mask ``(B, S)`` given or derived from ``pad_id``; None if nothing is
        padded. ValueError when padding precedes a real token (packing needs right padding)."""
        if mask is None:
            if tokens is None:
                return None
            mask = padding_mask(tokens, self.config.pad_id)
        if bool(mask.all()):
            return None
        prefix = torch.arange(mask.size(1), device=mask.device) < mask.sum(1, keepdim=True)
        if not torch.equal(mask, prefix):
            raise ValueError(
                "the LSTM encoder needs right-padded sources (padding only after the real "
                "tokens of each row)"
            )
        return mask

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (B, S)``, ``src_mask (B, S)`` (True = real) -> ``memory (B, S, D)``; padded
        positions of the memory are zero."""
        return self._encode(src, self._key_mask(src, src_mask))

    def _encode(self, src: Tensor, mask: Tensor | None) -> Tensor:
        """``encode`` with the mask already checked (``_key_mask``)."""
        x = self.embed_dropout(self.src_embed(src))
        if mask is None:
            return self.encoder(x)[0]
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        memory, _ = pad_packed_sequence(self.encoder(packed)[0], True, total_length=src.size(1))
        return memory

    # -- decoder ----------------------------------------------------------------------------

    def init_cache(self, memory: Tensor, src_mask: Tensor | None) -> RNNCache:
        """The decoder's initial state for ``memory (B, S, D)`` with source mask ``src_mask
        (B, S)`` (required, as in ``Transformer.init_cache``; None = no source padding)."""
        return self._init_cache(memory, self._key_mask(None, src_mask))

    def _init_cache(self, memory: Tensor, mask: Tensor | None) -> RNNCache:
        """``init_cache`` with the mask already checked (``_key_mask``)."""
        if mask is None:
            mean = memory.mean(dim=1)
        else:
            real = mask.unsqueeze(-1).to(memory.dtype)
            mean = (memory * real).sum(1) / real.sum(1).clamp(min=1)
        B, L, D = memory.size(0), self.config.num_decoder_layers, self.config.d_model
        h = torch.tanh(self.bridge(mean)).view(B, L, D).transpose(0, 1).contiguous()
        return RNNCache(h, torch.zeros_like(h), memory, self.attn_key(memory), mask)

    def _attend(self, h: Tensor, cache: RNNCache) -> tuple[Tensor, Tensor]:
        """Decoder states ``h (B, T, D)`` -> (features ``(B, T, D)``, the output layer's input,
        and attention ``(B, T, S)``)."""
        scores = torch.bmm(h, cache.keys.transpose(1, 2))
        if cache.memory_mask is not None:
            # a row without any real source position (all padding) attends everywhere
            open_row = ~cache.memory_mask.any(dim=1, keepdim=True)
            visible = (cache.memory_mask | open_row).unsqueeze(1)
            scores = scores.masked_fill(~visible, float("-inf"))
        attention = scores.softmax(dim=-1)
        context = torch.bmm(attention, cache.memory)
        state = torch.tanh(self.attn_out(torch.cat([context, h], dim=-1)))
        return self.dropout(state), attention

    def _step(self, tokens: Tensor, cache: RNNCache) -> tuple[Tensor, Tensor]:
        if tokens.size(0) != cache.batch_size:
            raise ValueError(
                f"tokens have batch size {tokens.size(0)} but the cache {cache.batch_size}"
            )
        x = self.embed_dropout(self.tgt_embed(tokens))
        h, (cache.h, cache.c) = self.decoder(x, (cache.h, cache.c))
        cache.length += tokens.size(1)
        return self._attend(h, cache)

    def decode_step(self, tokens: Tensor, cache: RNNCache) -> Tensor:
        """Incremental pass: ``tokens (B, T_new)`` -> ``logits (B, T_new, V)``, continuing
        the cache's state (updated in place)."""
        return self.output(self._step(tokens, cache)[0])

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None = None,
        *,
        tgt_right_padded: bool = False,
    ) -> Tensor:
        """Teacher-forced pass: ``tgt_in (B, T)``, ``memory (B, S, D)`` -> ``logits (B, T,
        V)``. The decoder is causal by construction, so target padding, which must follow the
        real tokens, changes no real position: ``tgt_mask`` and ``tgt_right_padded`` (taken
        for ``Transformer.decode``'s signature) are not needed."""
        return self.decode_step(tgt_in, self.init_cache(memory, src_mask))

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
        """``src (B, S)``, ``tgt_in (B, T)`` -> ``logits (B, T, V)`` (masks and
        ``features_only`` as in ``Transformer.forward``; targets must be right-padded, as in
        ``decode``)."""
        mask = self._key_mask(src, src_mask)  # checked once per batch
        cache = self._init_cache(self._encode(src, mask), mask)
        features = self._step(tgt_in, cache)[0]
        return features if features_only else self.output(features)

    def attention_maps(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> dict[str, list[Tensor]]:
        """As ``Transformer.attention_maps``: the one attention is ``decoder_cross``, one layer
        of one head ``(B, 1, T, S)``; an LSTM has no self-attention (empty lists)."""
        mask = self._key_mask(src, src_mask)
        cache = self._init_cache(self._encode(src, mask), mask)
        attention = self._step(tgt_in, cache)[1]
        return {"encoder_self": [], "decoder_self": [], "decoder_cross": [attention[:, None]]}
