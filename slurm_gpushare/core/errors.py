"""The one error type library code raises for mistakes a person can fix.

The CLI prints it as one line (``slurm-gpushare: <message>``) and exits with ``exit_code``; only
``--debug`` shows a traceback. Library code never depends on click for this.
"""

from __future__ import annotations


class UserError(Exception):
    """A bad argument, a missing file, an unreachable daemon: said in one line."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
