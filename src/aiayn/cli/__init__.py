"""The `python -m aiayn.<tool>` commands: Hydra `key=value` tools (visualize; prepare lives in
`aiayn.data.prepare`) and argparse file utilities (average, sweeps). Each turns an
`AiaynError` into one line and exit code 1 (`aiayn.errors.exit_on_error`)."""
