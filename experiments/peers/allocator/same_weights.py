"""Whether runs of one peer differ only in speed: for each update count that every run given
saved a checkpoint at, are the model weights bit for bit the same in all of them?

    <fairseq venv>/bin/python same_weights.py /tmp/peer_malloc_keep_a /tmp/peer_malloc_default_a ...

Reads fairseq's `ckpt/checkpoint_<epoch>_<updates>.pt` in each run's scratch directory
(PEER_WORK; the checkpoints are not in the record). Prints one line per shared update count:
the updates, `same` or the largest absolute difference of any weight. Exits 1 if any differs.
"""

import re
import sys
from pathlib import Path

import torch


def checkpoints(run: Path) -> dict[int, Path]:
    """updates -> the run's checkpoint file saved after them."""
    found = {}
    for path in (run / "ckpt").glob("checkpoint_*_*.pt"):
        match = re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", path.name)
        if match:
            found[int(match.group(1))] = path
    return found


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def main(runs: list[Path]) -> int:
    saved = [checkpoints(run) for run in runs]
    shared = sorted(set.intersection(*(set(s) for s in saved)))
    if not shared:
        print("no update count has a checkpoint in every run", file=sys.stderr)
        return 2
    differs = False
    for updates in shared:
        first = weights(saved[0][updates])
        largest = 0.0
        for other in saved[1:]:
            second = weights(other[updates])
            if first.keys() != second.keys():
                raise SystemExit(f"{other[updates]}: other parameters than {saved[0][updates]}")
            for name, tensor in first.items():
                largest = max(largest, (tensor.float() - second[name].float()).abs().max().item())
        differs |= largest > 0
        print(updates, "same" if largest == 0 else f"largest difference {largest:g}")
    return int(differs)


if __name__ == "__main__":
    sys.exit(main([Path(arg) for arg in sys.argv[1:]]))
