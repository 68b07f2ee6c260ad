"""`python evaluate.py ...`: the same command as `aiayn evaluate ...` (`aiayn.cli.evaluate`)."""

from aiayn.cli.evaluate import main

if __name__ == "__main__":
    main()
