"""``python -m gpubench`` runs the command line."""

from gpubench.cli import main

if __name__ == "__main__":
    main()
