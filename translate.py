"""python translate.py ckpt_path=... [input=<file|->] [output=<file|->] [decode=beam]
(conf/translate.yaml)"""

import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="translate")
def main(cfg: DictConfig) -> None:
    from aiayn.config import ConfigError
    from aiayn.translation import TranslationError, run

    try:
        run(cfg)
    except (ConfigError, TranslationError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
