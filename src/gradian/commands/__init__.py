"""CLI commands. Each module defines ``register(app: typer.Typer)``; see :mod:`gradian.cli`."""
