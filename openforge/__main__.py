"""``python -m openforge``: the ``openforge`` command."""

from .cli import main

main()
