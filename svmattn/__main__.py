"""``python -m svmattn COMMAND ...``: the ``svmattn`` command (see ``svmattn.cli``)."""
from svmattn import cli

cli.main()
