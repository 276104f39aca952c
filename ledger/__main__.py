"""``python -m ledger``: the ``ledger`` command without an installed entry point."""

from ._cli import main

main()
