"""`aiayn.nn.Transformer`: `torch.nn.Transformer`'s interface over aiayn's encoder and decoder
stacks, so code written against `torch.nn.Transformer` switches with one import
(`from aiayn.nn import Transformer`). Embedded inputs in, decoder states out; masks in
torch's conventions: `*_mask` `(L, S)` or `(N * nhead, L, S)` and `*_key_padding_mask`
`(N, S)`, bool (True = not allowed) or float (added to the scores).

Defaults are torch's: post-norm layers and a final LayerNorm on each stack, dropout 0.1 on
the residuals, the attention probabilities and the FFN activation. `copy_from(module)` takes
a `torch.nn.Transformer`'s weights (proven equal in `tests/model/test_nn_transformer.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.model.config import ModelConfig
from aiayn.model.transformer import Decoder, Encoder


class Transformer(nn.Module):
    """See the module docstring; arguments as `torch.nn.Transformer`'s (`bias=False`: no bias
    in any Linear or LayerNorm of the stacks, as torch's). Not supported (a ValueError names
    them): `custom_encoder`, `custom_decoder`, a callable `activation`, `layer_norm_eps` other
    than 1e-5."""

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        custom_encoder: nn.Module | None = None,
        custom_decoder: nn.Module | None = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        unsupported = {
            "custom_encoder": custom_encoder is not None,
            "custom_decoder": custom_decoder is not None,
            "a callable activation": not isinstance(activation, str),
            f"layer_norm_eps={layer_norm_eps}": layer_norm_eps != 1e-5,
        }
        if any(unsupported.values()):
            names = ", ".join(k for k, v in unsupported.items() if v)
            raise ValueError(f"aiayn.nn.Transformer does not support {names}")
        self.config = ModelConfig(
            d_model=d_model,
            num_heads=nhead,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            d_ff=dim_feedforward,
            dropout=dropout,
            attention_dropout=dropout,
            activation_dropout=dropout,
            activation=activation,
            norm_first=norm_first,
            final_norm=True,
            linear_bias=bias,
            norm_bias=bias,
        )
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)
        self.to(device=device, dtype=dtype)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> Tensor:
        """`src (S, N, E)`, `tgt (T, N, E)` (`(N, ·, E)` with `batch_first`) -> `(T, N, E)`.
        `*_is_causal` without a mask builds the causal mask."""
        if not self.batch_first:
            src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)
        n, s, t = src.size(0), src.size(1), tgt.size(1)
        causal = {
            "src": src_mask is None and bool(src_is_causal),
            "tgt": tgt_mask is None and bool(tgt_is_causal),
            "memory": memory_mask is None and memory_is_causal,
        }
        if causal["src"]:
            src_mask = self.generate_square_subsequent_mask(s, src.device)
        if causal["tgt"]:
            tgt_mask = self.generate_square_subsequent_mask(t, tgt.device)
        if causal["memory"]:
            memory_mask = torch.triu(torch.ones(t, s, dtype=torch.bool, device=src.device), 1)
        memory = self.encoder(src, mask=self._mask(src_mask, src_key_padding_mask, n, s, s, src))
        out = self.decoder(
            tgt,
            memory=memory,
            self_mask=self._mask(tgt_mask, tgt_key_padding_mask, n, t, t, tgt),
            memory_mask=self._mask(memory_mask, memory_key_padding_mask, n, t, s, tgt),
        )
        return out if self.batch_first else out.transpose(0, 1)

    def _mask(
        self, attn: Tensor | None, padding: Tensor | None, n: int, q: int, k: int, x: Tensor
    ) -> Tensor | None:
        """torch's attention mask and key-padding mask as one additive float mask
        `(N|1, H|1, Q, K)` for the attention modules (None when both are None)."""
        out = None
        for mask, shape in ((attn, None), (padding, (n, 1, 1, k))):
            if mask is None:
                continue
            if shape is None:
                shape = (n, self.nhead, q, k) if mask.dim() == 3 else (1, 1, q, k)
            mask = mask.reshape(shape)
            if mask.dtype == torch.bool:
                mask = torch.zeros(shape, dtype=x.dtype, device=x.device).masked_fill(
                    mask, float("-inf")
                )
            out = mask.to(x.dtype) if out is None else out + mask.to(x.dtype)
        return out

    @staticmethod
    def generate_square_subsequent_mask(
        sz: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Tensor:
        """torch's: `(sz, sz)` float, -inf above the diagonal, 0 elsewhere."""
        return nn.Transformer.generate_square_subsequent_mask(sz, device=device, dtype=dtype)

    @torch.no_grad()
    def copy_from(self, module: nn.Transformer) -> Transformer:
        """Take the weights of a `torch.nn.Transformer` of the same shape; returns self."""
        for ours, theirs in zip(self.encoder.layers, module.encoder.layers, strict=True):
            _copy_self_attention(ours.self_attn, theirs.self_attn)
            _copy_ff_norms(ours, theirs, 2)
        for ours, theirs in zip(self.decoder.layers, module.decoder.layers, strict=True):
            _copy_self_attention(ours.self_attn, theirs.self_attn)
            cross, d = theirs.multihead_attn, self.d_model
            ours.cross_attn.q_proj.weight.copy_(cross.in_proj_weight[:d])
            ours.cross_attn.kv_proj.weight.copy_(cross.in_proj_weight[d:])
            if cross.in_proj_bias is not None:  # bias=False: none on either side
                ours.cross_attn.q_proj.bias.copy_(cross.in_proj_bias[:d])
                ours.cross_attn.kv_proj.bias.copy_(cross.in_proj_bias[d:])
            ours.cross_attn.out_proj.load_state_dict(cross.out_proj.state_dict())
            _copy_ff_norms(ours, theirs, 3)
        self.encoder.norm.load_state_dict(module.encoder.norm.state_dict())
        self.decoder.norm.load_state_dict(module.decoder.norm.state_dict())
        return self


def _copy_self_attention(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    ours.qkv_proj.weight.copy_(theirs.in_proj_weight)
    if theirs.in_proj_bias is not None:
        ours.qkv_proj.bias.copy_(theirs.in_proj_bias)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


def _copy_ff_norms(ours: nn.Module, theirs: nn.Module, norms: int) -> None:
    ours.ff.linear1.load_state_dict(theirs.linear1.state_dict())
    ours.ff.linear2.load_state_dict(theirs.linear2.state_dict())
    for i in range(1, norms + 1):
        getattr(ours, f"norm{i}").load_state_dict(getattr(theirs, f"norm{i}").state_dict())
