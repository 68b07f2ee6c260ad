"""`python train.py ...`: the same command as `aiayn train ...` (`aiayn.cli.train`)."""

from aiayn.cli.train import main

if __name__ == "__main__":
    main()
