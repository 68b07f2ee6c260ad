"""`aiayn evaluate ckpt_path=<ckpt> [split=test] [decode=beam] [key=value ...]` (also
`python evaluate.py`): decode a split of the checkpoint's data and score it, or score given
files (conf/eval.yaml; schema `aiayn.config.EvalConfig`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import (
    CONF_DIR,
    EvalConfig,
    check_command_line,
    check_edits_of_unset_group,
    register,
)
from aiayn.errors import exit_if_jobs_failed, exit_on_error

register()
WHY = "the data settings are the checkpoint's run's; split=val|test picks one of its splits"


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
@exit_on_error
def evaluate(cfg: DictConfig) -> float | None:
    from aiayn.inference.evaluation import run

    return run(cfg).get("bleu")  # the objective for Hydra sweepers; none with mode=score


def main() -> None:
    exit_on_error(check_edits_of_unset_group)(sys.argv[1:], "data", WHY)
    exit_on_error(check_command_line)(sys.argv[1:], EvalConfig)
    evaluate()
    exit_if_jobs_failed()  # a multirun's jobs all ran; say which failed


if __name__ == "__main__":
    main()
