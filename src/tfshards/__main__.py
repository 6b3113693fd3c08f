"""``python -m tfshards`` runs the command-line interface."""

from tfshards.cli import main

main()
