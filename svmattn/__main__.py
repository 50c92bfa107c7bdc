"""``python -m svmattn COMMAND ...``: the ``svmattn`` command (see ``svmattn.cli``, ``svmattn.launch``)."""
from svmattn import launch

launch.main()
