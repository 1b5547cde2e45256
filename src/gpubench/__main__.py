"""``python -m gpubench`` runs the command line: the same entry point as the ``gpubench`` console
script (:func:`gpubench.cli.main`, whose first statements guard SIGINT and SIGTERM)."""

if __name__ == "__main__":
    from gpubench.cli import main

    main()
