"""The one check every command runs before it writes a file (`check_output`).

An output is refused, in one `OutputError` naming its key and what to do, when writing it
would change something the command does not own:

- one of the command's inputs (checkpoint, export, input text, prefix file, tokenizer,
  references), compared by device and inode after resolving symlinks, so a path, a symlink
  chain or a hard link to an input all count; '-' stands for standard input or output;
- a record of a run (an existing file under a directory with `.hydra/`: `.hydra/*`,
  `checkpoints/*`, `csv/*`, `metrics.json`, a `*.ckpt`, or a `*.ct2/` conversion that
  earlier versions kept beside a checkpoint);
- a file of a CTranslate2 export (an existing `model.bin`, `aiayn.json`, ... beside an
  `aiayn.json`), or any existing `*.ckpt` where the command does not write checkpoints;
- a symbolic link to a regular file, a directory or nothing (writing would go through it:
  remove the link or name another file), a directory where a file is wanted, or a file with
  other hard links (writing it in place would change them all).

Devices and pipes (`/dev/null`, a FIFO) are fine: they hold nothing a write would destroy.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from aiayn.errors import OutputError

# what an export directory holds: CTranslate2's model and vocabularies, the tokenizer(s), ours
EXPORT_FILES = re.compile(
    r"(model\.bin|config\.json|\w*vocabulary\.(json|txt)|tokenizer[.\w]*\.json|aiayn\.json)$"
)
RUN_RECORD_DIRS = (".hydra", "checkpoints", "csv")
RUN_RECORD_FILES = ("metrics.json",)

PathLike = str | os.PathLike
Inputs = Mapping[str, PathLike | Iterable[PathLike] | None]


def file_id(name: PathLike, stream: int | None = None) -> tuple[int, int] | None:
    """(device, inode) of the regular file `name` after resolving symlinks, or of the file
    behind the standard stream `stream` for '-'; None for what does not exist or is not a
    regular file (a terminal, a pipe, a device)."""
    try:
        if str(name) == "-":
            if stream is None:
                return None
            status = os.fstat(stream)
        else:
            status = os.stat(name)
    except OSError:
        return None
    return (status.st_dev, status.st_ino) if stat.S_ISREG(status.st_mode) else None


def _paths(value: PathLike | Iterable[PathLike] | None) -> list[str]:
    """The paths of an input: itself, each of a list, the files of a directory."""
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if path.is_dir():
            return sorted(os.fspath(p) for p in path.iterdir() if p.is_file())
        return [os.fspath(value)]
    return [p for v in value if v is not None for p in _paths(v)]


def check_output(
    output: PathLike,
    key: str,
    inputs: Inputs | None = None,
    checkpoint: bool = False,
) -> None:
    """Refuse (`OutputError`) to write the file `output`, the value of `key` ('output', '-o',
    ...), over an input (`inputs`: their keys -> a path or paths; '-' is standard input), a
    run's record, an export's file, through a symlink, into a directory or over a hard-linked
    file. `checkpoint`: the command writes checkpoints (an existing `*.ckpt` outside a run
    may then be its own earlier one; the command judges that)."""
    name = os.fspath(output)
    given = f"{key} {name}"
    if name == "-":  # standard output redirected into an input file
        target = file_id("-", 1)
        for what, source in (inputs or {}).items():
            for path in _paths(source):
                if target is not None and target == file_id(path, 0):
                    raise OutputError(
                        f"{key} - (standard output) is the same file as {what} {path}: "
                        f"writing would overwrite it; redirect the output to another file"
                    )
        return
    path = Path(name)
    if path.is_symlink():
        resolved = path.resolve()
        if not resolved.exists() or resolved.is_dir() or resolved.is_file():
            raise OutputError(
                f"{given} is a symbolic link (to {os.readlink(path)}): writing would go "
                f"through it; remove the link or name another file"
            )
    if path.is_dir():
        raise OutputError(f"{given} is a directory: name a file to write")
    check_parent(path, given)
    target = file_id(path)
    for what, source in (inputs or {}).items():
        for other in _paths(source):
            same_path = other != "-" and path.resolve() == Path(other).resolve()
            if same_path or (target is not None and target == file_id(other, 0)):
                raise OutputError(
                    f"{given} is the same file as {what} {other}: writing would overwrite "
                    f"it; choose another {key}"
                )
    if target is None:
        return
    owner = _owner(path.resolve(), checkpoint)
    if owner:
        raise OutputError(f"{given} is {owner}: nothing was written; choose another {key}")
    links = os.stat(path).st_nlink
    if links > 1:
        raise OutputError(
            f"{given} has {links - 1} other hard link(s): writing would change them too; "
            f"choose another {key}"
        )


def check_output_dir(directory: PathLike, key: str) -> Path:
    """Refuse (`OutputError`) a directory to write into that is a file or cannot be created
    (`check_parent`); returns it as a Path."""
    path = Path(directory)
    given = f"{key}={os.fspath(directory)}"
    if path.exists() and not path.is_dir():
        raise OutputError(f"{given} is a file: name a directory")
    check_parent(path, given)
    return path


def check_parent(path: Path, given: str) -> None:
    """Refuse (`OutputError`) a path that cannot be created: its nearest existing ancestor is
    not a directory (`out.txt/x`) or is one nobody may create files in."""
    ancestor = next(p for p in (path.absolute().parent, *path.absolute().parents) if p.exists())
    if not ancestor.is_dir():
        raise OutputError(
            f"{given} lies under {ancestor}, which is a file: name a path in a directory"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"{given}: {ancestor} is not writable here; name a path you can write")


def run_around(directory: Path) -> Path | None:
    """`directory` or its nearest parent that is a run's directory (its Hydra record,
    `.hydra/config.yaml`), else None."""
    directory = directory.resolve()
    found = (d for d in (directory, *directory.parents) if (d / ".hydra" / "config.yaml").is_file())
    return next(found, None)


def _owner(path: Path, checkpoint: bool) -> str | None:
    """What owns the existing regular file `path` (resolved), in words, or None."""
    run = run_around(path.parent)
    if run is not None:
        inside = path.relative_to(run).parts
        top = inside[0]
        if top in RUN_RECORD_DIRS or top.endswith(".ct2") or path.suffix == ".ckpt":
            return f"a record of the run {run} ({'/'.join(inside)})"
        if len(inside) == 1 and top in RUN_RECORD_FILES:
            return f"a record of the run {run} ({top})"
    if EXPORT_FILES.fullmatch(path.name) and (path.parent / "aiayn.json").is_file():
        return f"a file of the CTranslate2 export {path.parent}"
    if path.suffix == ".ckpt" and not checkpoint:
        return "a checkpoint"
    return None
