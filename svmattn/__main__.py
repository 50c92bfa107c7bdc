"""``python -m svmattn COMMAND ...``: the ``svmattn`` command (see ``svmattn.cli``)."""
from svmattn.execution import workers

workers.die_with_parent_from_env()     # started by reproduce: end with it, even if it is killed

from svmattn import cli  # noqa: E402

cli.main()
