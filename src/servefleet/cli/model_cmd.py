"""Placeholder until this command group is written."""

import typer


def register(app: typer.Typer) -> None:
    pass
