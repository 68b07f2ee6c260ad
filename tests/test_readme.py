"""Every command the README shows for train.py, evaluate.py, translate.py,
`python -m aiayn.visualize`, `python -m aiayn.export` and `python -m aiayn.data.prepare` (or
as `aiayn <command>`, the console script) composes, exactly as written, into a valid config;
multirun commands also resolve their sweep directory the way Hydra does at launch, before its
runtime is set (the step where `python train.py -m sweep=heads` once crashed). Running them
is the smoke and slow layers' job; a README line that no longer parses or validates fails
here. tests/test_docs.py runs the same check over the docs pages."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from unittest import mock

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from aiayn.config import (
    EvalConfig,
    ExportConfig,
    PrepareConfig,
    TrainConfig,
    TranslateConfig,
    VisualizeConfig,
    to_schema,
)
from tests.helpers import REPO, compose_with_hydra

# the Hydra entry points, in their long form: (config name, schema)
ENTRY_POINTS = {
    "train.py": ("train", TrainConfig),
    "evaluate.py": ("eval", EvalConfig),
    "translate.py": ("translate", TranslateConfig),
    "-m aiayn.visualize": ("visualize", VisualizeConfig),
    "-m aiayn.export": ("export", ExportConfig),
    "-m aiayn.data.prepare": ("prepare", PrepareConfig),
}
# `aiayn <command>` and the long form it stands for (`python <long form>`); the argparse
# tools (average, sweeps, curves) take files, not a config, so only their names are checked
CONSOLE = {
    "train": "train.py",
    "evaluate": "evaluate.py",
    "translate": "translate.py",
    "prepare": "-m aiayn.data.prepare",
    "export": "-m aiayn.export",
    "average": "-m aiayn.averaging",
    "sweeps": "-m aiayn.sweeps",
    "visualize": "-m aiayn.visualize",
    "curves": "-m aiayn.cli.curves",
}
PLACEHOLDER = re.compile(r"<[^>]+>")
_LONG = "|".join(re.escape(entry) for entry in ENTRY_POINTS)
_SHORT = "|".join(name for name, long in CONSOLE.items() if long in ENTRY_POINTS)
PATTERN = re.compile(rf"(?:python3? ({_LONG})|(?<![\w./-])aiayn ({_SHORT}))(?=\s|$)(.*)")


def code_lines(path: Path) -> list[str]:
    """The lines inside the fenced code blocks of a Markdown file."""
    lines, in_block = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block:
            lines.append(line)
    return lines


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """(entry point in its long form, argv) of each command line in a Markdown file's code
    blocks, comments and redirections removed; `aiayn train ...` is `python train.py ...`.
    `--help` lines compose nothing and are left out."""
    found = []
    for line in code_lines(path):
        match = PATTERN.search(line.split("  #")[0])
        if match and "&&" not in match.group(3):
            entry = match.group(1) or CONSOLE[match.group(2)]
            args = shlex.split(match.group(3).split(" > ")[0])
            if not {"--help", "-h"} & set(args):
                found.append((entry, args))
    return found


def runs(args: list[str]) -> list[list[str]]:
    """The overrides of each job a command starts: a multirun's comma lists expanded."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    jobs: list[list[str]] = [[]]
    for arg in args:
        if arg in ("-m", "--cfg", "job"):
            continue
        arg = PLACEHOLDER.sub("placeholder", arg)  # <ckpt>, <ts>: paths the user fills in
        (override,) = OverridesParser.create().parse_overrides([arg])
        if override.is_sweep_override():
            values = [f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()]
        else:
            values = [arg]
        jobs = [[*job, value] for job in jobs for value in values]
    return jobs


def check_command(entry: str, args: list[str], tmp_path: Path) -> None:
    """Compose the command as written (each job of a multirun) and validate it as its entry
    point does before any work."""
    name, schema = ENTRY_POINTS[entry]
    for overrides in runs(args):
        # the command as written; the run directories it claims while resolving go to tmp_path
        cfg = compose_with_hydra(name, [*overrides, f"paths.log_dir={tmp_path / 'logs'}"])
        if "-m" in args:  # Hydra resolves the sweep directory before it sets its runtime
            HydraConfig.instance().cfg = None  # type: ignore[assignment]
            assert OmegaConf.select(cfg, "hydra.sweep.dir")
        HydraConfig.instance().set_config(cfg)
        assert OmegaConf.select(cfg, "hydra.run.dir")
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path)
            for key in ("ckpt_path", "init_from"):  # a run to resume or to start from:
                if name == "train" and "placeholder" in str(cfg.get(key)):
                    cfg[key] = None  # everything else must validate
            del cfg.hydra
        assert isinstance(to_schema(cfg, schema), schema)
        if name == "train":  # and the run-level checks train.py makes before any work, as on
            # a machine with the GPU a command may ask for (this one may have none)
            from aiayn.training.run import validate

            with mock.patch("aiayn.training.devices.check_accelerator"):
                validate(cfg)


COMMANDS = commands(REPO / "README.md")


def test_the_readme_shows_commands_of_every_entry_point():
    assert {entry for entry, _ in COMMANDS} == set(ENTRY_POINTS)
    assert len(COMMANDS) >= 20


@pytest.mark.slow  # ~30 s of composing: CI's slow layer runs it (as the docs pages' checks)
@pytest.mark.parametrize(("entry", "args"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_readme_command_composes_and_validates(entry, args, tmp_path):
    check_command(entry, args, tmp_path)
