"""The commands' bodies, one module per command group.  Each imports the harness at its top; a
command of ``harness.cli`` imports its body here only when it runs, so ``harness --help`` and
the thin modules Typer reads load none of this."""
