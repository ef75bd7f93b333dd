"""Placeholder: commands are registered here (being written this session)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
