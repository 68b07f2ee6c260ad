"""`python -m aiayn <command> [args ...]`: the same as `aiayn <command>` (`aiayn.cli.main`)."""

from aiayn.cli.main import main

if __name__ == "__main__":
    main()
