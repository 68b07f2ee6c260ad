"""Decoding speed: aiayn `generate` vs Hugging Face `transformers` `generate()` on a Marian
model of the same size (random weights), greedy and beam 4, same inputs and output lengths.

    python benchmarks/decode_speed.py [--d-model 256 --heads 4 --layers 3 --ffn 1024
        --vocab 8000 --batch-size 32 --src-len 20 --new-tokens 30 --repeats 5 --threads 2]

Both sides decode exactly `--new-tokens` tokens per sentence: EOS is disabled (aiayn: a hook
masks the EOS logit; HF: `eos_token_id=None`), and both keep a key/value cache. Prints
sentences/s (best of `--repeats` alternating calls after a warm-up) for each strategy side by side.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from transformers import MarianConfig, MarianMTModel

from aiayn.model import DecodeConfig, ModelConfig, Transformer, generate

PAD, EOS = 0, 2


def best_times(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Seconds of the fastest of `repeats` calls of each fn after one warm-up call each. The
    calls alternate between the fns, so that load from other processes hits all alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [min(spent) for spent in times]


def build(args: argparse.Namespace) -> tuple[Transformer, MarianMTModel]:
    torch.manual_seed(0)
    ours = Transformer(
        ModelConfig(
            src_vocab_size=args.vocab,
            tgt_vocab_size=args.vocab,
            d_model=args.d_model,
            num_heads=args.heads,
            num_encoder_layers=args.layers,
            num_decoder_layers=args.layers,
            d_ff=args.ffn,
            dropout=0.0,
            max_positions=512,
        )
    ).eval()
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=args.vocab,
            decoder_vocab_size=args.vocab,
            d_model=args.d_model,
            encoder_layers=args.layers,
            decoder_layers=args.layers,
            encoder_attention_heads=args.heads,
            decoder_attention_heads=args.heads,
            encoder_ffn_dim=args.ffn,
            decoder_ffn_dim=args.ffn,
            activation_function="relu",
            max_position_embeddings=512,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            scale_embedding=True,
            pad_token_id=PAD,
            eos_token_id=2,
            decoder_start_token_id=PAD,
            forced_eos_token_id=None,
        )
    ).eval()
    return ours, marian


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [
        ("d-model", 256),
        ("heads", 4),
        ("layers", 3),
        ("ffn", 1024),
        ("vocab", 8000),
        ("batch-size", 32),
        ("src-len", 20),
        ("new-tokens", 30),
        ("repeats", 5),
        ("threads", 2),
    ]:
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ours, marian = build(args)
    # no sentence may end early (HF runs with eos_token_id=None): aiayn never emits EOS
    ours.output.register_forward_hook(
        lambda module, args, logits: logits.index_fill(-1, torch.tensor([EOS]), -1e9)
    )
    src = torch.randint(4, args.vocab, (args.batch_size, args.src_len))
    mask = torch.ones_like(src)
    n = args.new_tokens

    def aiayn(beams: int) -> Callable[[], object]:
        strategy = "greedy" if beams == 1 else "beam"
        config = DecodeConfig(strategy=strategy, beam_size=beams, max_len_a=0.0, max_len_b=n)

        def run() -> None:
            hyps = generate(ours, src, config)
            assert all(len(h[0].tokens) == n for h in hyps)

        return run

    def hf(beams: int) -> Callable[[], object]:
        penalty = {"length_penalty": 0.6} if beams > 1 else {}

        @torch.inference_mode()
        def run() -> None:
            out = marian.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=beams,
                do_sample=False,
                max_new_tokens=n,
                eos_token_id=None,
                use_cache=True,
                **penalty,
            )
            assert out.shape == (args.batch_size, n + 1)  # decoder start + n tokens

        return run

    print(
        f"model d={args.d_model} h={args.heads} layers={args.layers}+{args.layers} "
        f"ffn={args.ffn} vocab={args.vocab}; batch {args.batch_size} x src {args.src_len} -> "
        f"{n} tokens; torch {torch.__version__}, {args.threads} threads"
    )
    print(f"| {'strategy':<8} | {'aiayn sent/s':>12} | {'HF sent/s':>10} | {'speed-up':>8} |")
    print(f"|{'-' * 10}|{'-' * 14}|{'-' * 12}|{'-' * 10}|")
    for beams in (1, 4):
        ours_s, hf_s = best_times([aiayn(beams), hf(beams)], args.repeats)
        name = "greedy" if beams == 1 else f"beam {beams}"
        print(
            f"| {name:<8} | {args.batch_size / ours_s:>12.1f} | {args.batch_size / hf_s:>10.1f} "
            f"| {hf_s / ours_s:>7.2f}x |"
        )


if __name__ == "__main__":
    main()
