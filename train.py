"""python train.py [group=option ...] [key=value ...]   (see conf/train.yaml and README.md)"""

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import ConfigError
from aiayn.data.errors import DataError


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from aiayn.train import run

    try:
        metrics = run(cfg)
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    except DataError as err:
        sys.exit(f"data error: {err}")
    return metrics.get("best", {}).get("val/bleu")  # the objective for Hydra sweepers


if __name__ == "__main__":
    main()
