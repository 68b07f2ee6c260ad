"""`python -m aiayn.sweeps`: the documented command name; the tool is `aiayn.cli.sweeps`."""

from aiayn.cli.sweeps import main

if __name__ == "__main__":
    main()
