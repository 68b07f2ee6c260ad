"""`python -m aiayn.export`: the documented command name; the tool is `aiayn.cli.export`."""

from aiayn.cli.export import main

if __name__ == "__main__":
    main()
