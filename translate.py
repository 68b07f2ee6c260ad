"""`python translate.py ...`: the same command as `aiayn translate ...` (`aiayn.cli.translate`)."""

from aiayn.cli.translate import main

if __name__ == "__main__":
    main()
