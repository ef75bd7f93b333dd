"""The CLI's console for standard output: a terminal's own width; where the output is a pipe or a
file, 200 columns (rich's default there is 80, which cuts table rows and wraps sentences; and a
console made at import would otherwise take its width from whatever environment the process had
then)."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 200


def stdout_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
