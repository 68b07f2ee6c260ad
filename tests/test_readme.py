"""Every command the README shows for train.py, evaluate.py, translate.py,
`python -m aiayn.visualize` and `python -m aiayn.export` composes, exactly as written, into a
valid config; multirun commands also resolve their sweep directory the way Hydra does at
launch, before its runtime is set (the step where `python train.py -m sweep=heads` once
crashed). Running them is the smoke and slow layers' job; a README line that no longer parses
or validates fails here."""

from __future__ import annotations

import re
import shlex

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from aiayn.config import (
    EvalConfig,
    ExportConfig,
    TrainConfig,
    TranslateConfig,
    VisualizeConfig,
    to_schema,
)
from tests.helpers import REPO, compose_with_hydra

ENTRY_POINTS = {
    "train.py": ("train", TrainConfig),
    "evaluate.py": ("eval", EvalConfig),
    "translate.py": ("translate", TranslateConfig),
    "-m aiayn.visualize": ("visualize", VisualizeConfig),
    "-m aiayn.export": ("export", ExportConfig),
}
PLACEHOLDER = re.compile(r"<[^>]+>")
PATTERN = re.compile(
    r"python (train\.py|evaluate\.py|translate\.py|-m aiayn\.visualize|-m aiayn\.export)(.*)"
)


def readme_commands() -> list[tuple[str, list[str]]]:
    """(entry point, argv) of each command line in the README's code blocks, comments and
    redirections removed."""
    commands, in_block = [], False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        match = PATTERN.search(line.split("  #")[0]) if in_block else None
        if match and "&&" not in match.group(2):
            args = shlex.split(match.group(2).split(" > ")[0])
            commands.append((match.group(1), args))
    return commands


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


COMMANDS = readme_commands()


def test_the_readme_shows_commands_of_every_entry_point():
    assert {entry for entry, _ in COMMANDS} == set(ENTRY_POINTS)
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(("entry", "args"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_readme_command_composes_and_validates(entry, args, tmp_path):
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
        if name == "train":  # and the run-level checks train.py makes before any work
            from aiayn.training.run import validate

            validate(cfg)
