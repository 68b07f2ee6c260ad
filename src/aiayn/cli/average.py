"""`python -m aiayn.averaging`: average the weights of checkpoints into one checkpoint.

    python -m aiayn.averaging a.ckpt b.ckpt ... -o averaged.ckpt
    python -m aiayn.averaging --last 5 <run>/checkpoints -o averaged.ckpt

`--last N DIR` takes the N checkpoints of DIR with the highest `global_step` (one per step:
`last.ckpt` and a step checkpoint of the same step count once). Keep one checkpoint per
validation with `callbacks.model_checkpoint.save_top_k=-1
"callbacks.model_checkpoint.filename='step{step}'"`, or use `callbacks=[default,average]`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.errors import AiaynError, AveragingError, exit_on_error
from aiayn.inference.averaging import average_checkpoints, last_checkpoints
from aiayn.inference.checkpoint import read_checkpoint, save_atomically
from aiayn.outputs import check_output as check_output_file


def check_output(output: Path, inputs: list[Path]) -> None:
    """Refuse to overwrite a checkpoint the averaging did not write: one of its inputs, any
    record of a run directory (`<run>/checkpoints/`), a link, or any other file but an
    earlier average (`aiayn.outputs.check_output`); a new file, or an earlier average
    elsewhere, is fine."""
    check_output_file(output, "-o", {"one of the checkpoints to average": inputs}, True)
    if not output.exists():
        return
    try:
        earlier = "averaged_from" in read_checkpoint(output)
    except AiaynError:
        earlier = False
    if not earlier:
        raise AveragingError(f"-o {output} exists and is not an earlier average: name a new file")


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="aiayn average",
        description="Average the weights of checkpoints into one loadable checkpoint.",
    )
    parser.add_argument("inputs", nargs="+", help="checkpoints, or one directory with --last")
    parser.add_argument("--last", type=int, help="average the N newest checkpoints of a directory")
    parser.add_argument("-o", "--output", required=True, help="the averaged .ckpt to write")
    args = parser.parse_args(argv)
    if args.last is not None:
        if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
            raise AveragingError("--last N takes one directory of checkpoints")
        paths = last_checkpoints(args.inputs[0], args.last)
    else:
        paths = [Path(p) for p in args.inputs]
    check_output(Path(args.output), paths)
    save_atomically(average_checkpoints(paths), args.output)
    print(f"averaged {len(paths)} checkpoints -> {args.output}")
    for path in paths:
        print(f"  {path}")


if __name__ == "__main__":
    main()
