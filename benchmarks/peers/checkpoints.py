"""Which checkpoints a peer averages, and the average where a peer ships no averaging tool:
eole 0.6.4 has none; fairseq's and JoeyNMT's `scripts/average_checkpoints.py` are in their
repositories, not in the packages installed (fairseq-fixed 0.12.3.1, JoeyNMT 2.3.0).

Setting 1 averages, for every system, the last 5 checkpoints an epoch apart: the final weights
and those nearest 1, 2, 3 and 4 epochs before them, as aiayn's recipe averages its final weights
and its last 4 epoch ends. Each saves every fixed number of updates (fairseq at its epoch
ends, JoeyNMT at each validation, set to its epoch) and its final weights, and `pick` chooses
among them.

    ls model/ | python checkpoints.py pick --every 236 --pattern 'step_(\\d+)'
    python checkpoints.py average-safetensors --out avg step_a step_b ...   # eole
    python checkpoints.py average-torch --key model_state --out avg.ckpt 1.ckpt 2.ckpt ...
    # JoeyNMT (`model_state`), fairseq (`model`)
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

COUNT = 5  # checkpoints averaged
EPOCH_UPDATES = 236  # aiayn's updates in one Multi30k epoch of <= 2 000-token batches


def pick(updates: list[int], every: float, count: int = COUNT) -> list[int]:
    """The last of `updates` and, for k = 1 .. count - 1, the one nearest `every` * k updates
    before it (each used once; the earlier one on a tie), oldest first."""
    left = sorted(set(updates))
    if not left:
        raise SystemExit("no checkpoints to average")
    chosen = [left.pop()]
    for k in range(1, count):
        if not left:
            break
        target = chosen[0] - every * k
        nearest = min(left, key=lambda u: (abs(u - target), u))
        left.remove(nearest)
        chosen.append(nearest)
    return sorted(chosen)


def mean(states: list[dict]) -> dict:
    """The elementwise mean of the floating tensors (in float64, cast back), the others taken
    from the last state. (aiayn's `average_state_dicts` does this for aiayn's checkpoints; this
    runs in each peer's own venv, the only place its checkpoints unpickle, where aiayn is not
    installed.)"""
    return {
        name: sum(s[name].double() for s in states).div(len(states)).to(tensor.dtype)
        if tensor.is_floating_point()
        else tensor
        for name, tensor in states[-1].items()
    }


def average_safetensors(directories: list[Path], out: Path) -> None:
    """The mean weights of eole checkpoint directories (`model.*.safetensors` and the rest),
    written as a copy of the last one with its tensors replaced."""
    from safetensors.torch import load_file, save_file

    last = directories[-1]
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(last, out)
    for shard in sorted(last.glob("*.safetensors")):
        averaged = mean([load_file(directory / shard.name) for directory in directories])
        save_file(averaged, out / shard.name, metadata={"format": "pt"})


def average_torch(paths: list[Path], key: str, out: Path) -> None:
    """The mean weights `checkpoint[key]` of torch checkpoints (JoeyNMT's `model_state`,
    fairseq's `model`), written as a copy of the last checkpoint with that entry replaced."""
    import torch

    checkpoints = [torch.load(path, map_location="cpu", weights_only=False) for path in paths]
    averaged = dict(checkpoints[-1])
    averaged[key] = mean([checkpoint[key] for checkpoint in checkpoints])
    torch.save(averaged, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    chooser = commands.add_parser("pick", help="read names on stdin, print those to average")
    chooser.add_argument("--every", type=int, default=EPOCH_UPDATES, help="updates an epoch")
    chooser.add_argument(
        "--per", type=int, default=1, help="updates a number stands for (Sockeye's checkpoints)"
    )
    chooser.add_argument("--pattern", required=True, help="a regex whose group is the update")
    averager = commands.add_parser("average-safetensors")
    averager.add_argument("--out", type=Path, required=True)
    averager.add_argument("directories", type=Path, nargs="+")
    torch_averager = commands.add_parser("average-torch")
    torch_averager.add_argument("--key", required=True, help="the entry holding the weights")
    torch_averager.add_argument("--out", type=Path, required=True)
    torch_averager.add_argument("paths", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "pick":
        names: dict[int, str] = {}
        for line in sys.stdin.read().split():
            match = re.search(args.pattern, line)
            if match:
                names[int(match.group(1))] = line
        print("\n".join(names[u] for u in pick(list(names), args.every / args.per)))
    elif args.command == "average-safetensors":
        average_safetensors(args.directories, args.out)
    else:
        average_torch(args.paths, args.key, args.out)


if __name__ == "__main__":
    main()
