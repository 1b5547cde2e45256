"""gpubench's own commands, one package each; every package's ``__init__`` holds its ``PLUGIN``
(:class:`gpubench.core.plugin.Plugin`), declared as an entry point of the group
``gpubench.plugins`` in pyproject.toml, the way a third party declares theirs."""
