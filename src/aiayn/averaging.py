"""`python -m aiayn.averaging`: the documented command name; the tool is `aiayn.cli.average`."""

from aiayn.cli.average import main

if __name__ == "__main__":
    main()
