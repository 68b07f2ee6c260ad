"""python evaluate.py ckpt_path=... [data=...] [split=test] [decode=beam]   (conf/eval.yaml)"""

import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> float:
    from aiayn.config import ConfigError
    from aiayn.data.errors import DataError
    from aiayn.evaluation import run
    from aiayn.translation import TranslationError

    try:
        return run(cfg)["bleu"]
    except (ConfigError, DataError, TranslationError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
