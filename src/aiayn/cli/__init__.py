"""The commands: `aiayn <command>` (`aiayn.cli.main`) runs `aiayn.cli.<command>`. Hydra
`key=value` tools (train, evaluate, translate, prepare, export, visualize) and argparse file
utilities (average, sweeps, curves). Each turns an `AiaynError` into one line and exit code 1
(`aiayn.errors.exit_on_error`)."""
