"""``python -m pubsubd`` runs the CLI."""

from pubsubd.cli.main import main

main()
