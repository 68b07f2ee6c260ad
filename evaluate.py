"""python evaluate.py ckpt_path=... [data=...] [split=test] [decode=beam]   (conf/eval.yaml)"""

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import check_edits_of_unset_group, register
from aiayn.errors import exit_on_error

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
@exit_on_error
def main(cfg: DictConfig) -> float:
    from aiayn.inference.evaluation import run

    return run(cfg).get("bleu")  # the objective for Hydra sweepers; none with mode=score


if __name__ == "__main__":
    why = "the data settings are the checkpoint's run's; split=val|test picks one of its splits"
    exit_on_error(check_edits_of_unset_group)(sys.argv[1:], "data", why)
    main()
