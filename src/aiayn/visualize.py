"""`python -m aiayn.visualize`: the documented command name; the tool is `aiayn.cli.visualize`."""

from aiayn.cli.visualize import main

if __name__ == "__main__":
    main()
