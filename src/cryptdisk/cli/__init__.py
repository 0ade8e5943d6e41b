"""The ``cryptdisk`` command line.

Each command group lives in its own module that exposes ``register(subparsers)``;
:data:`COMMAND_MODULES` lists them in help order. A module whose optional
dependency is missing is skipped with a note in ``--help`` rather than breaking
every other command.
"""

from __future__ import annotations

from ._app import COMMAND_MODULES, main

__all__ = ["COMMAND_MODULES", "main"]
