"""`aiayn <command> [args ...]` (also `python -m aiayn`): one entry point for every tool.

Each command is a thin module of this package, run as if by `python -m aiayn.cli.<module>`
(`runpy` with `alter_sys`): its `--help` is its own (Hydra's groups and keys, or argparse's
arguments), and Lightning's DDP launcher, which starts the other ranks from `sys.argv` and
`__main__.__spec__`, restarts the same command."""

from __future__ import annotations

import runpy
import sys

# name: (module, what it does, the long form that keeps working)
COMMANDS = {
    "train": ("train", "train, validate and test a model", "python train.py"),
    "evaluate": ("evaluate", "decode a split or files and score them", "python evaluate.py"),
    "translate": ("translate", "translate lines with a checkpoint", "python translate.py"),
    "prepare": ("prepare", "build a corpus's data cache", "python -m aiayn.data.prepare"),
    "export": ("export", "convert a checkpoint for CTranslate2", "python -m aiayn.export"),
    "average": ("average", "average checkpoints into one", "python -m aiayn.averaging"),
    "sweeps": ("sweeps", "summarise multiruns (Table 3)", "python -m aiayn.sweeps"),
    "visualize": ("visualize", "draw attention heatmaps", "python -m aiayn.visualize"),
    "curves": ("curves", "plot val curves against wall clock", "python -m aiayn.cli.curves"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: aiayn <command> [args ...]", "", "commands:"]
    for name, (_, what, long_form) in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {what:<42} ({long_form})")
    lines += ["", "aiayn <command> --help shows a command's config groups and keys, or arguments."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        raise SystemExit(0 if args else 2)
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"aiayn: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = [sys.argv[0], *rest]
    runpy.run_module(f"aiayn.cli.{COMMANDS[name][0]}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
