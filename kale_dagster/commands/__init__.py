"""Subcommands of the ``kale`` CLI, one module each (see ``kale_dagster.cli``)."""
