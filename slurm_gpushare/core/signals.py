"""Signals acted on by a thread, never inside a signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock the handler's own work needs (an Event's; the thread registry's, which
the daemon's main thread takes to start each connection's thread and a stop handler took to
start the shutdown's): the process deadlocks, alive and deaf to further signals (the node
agent's collector did). So the handler
installed here does nothing; the interpreter's C-level handler writes the signal's number to a
pipe (``signal.set_wakeup_fd``) and a watcher thread reads it and calls back, holding no lock of
the code it interrupted. The signal mask is left unblocked, so processes started later
(Slurm commands, the spool drainer) inherit an ordinary one.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


def _ignore(_signum, _frame) -> None:
    """The Python-level handler: the work is the watcher's."""


def handle_in_thread(signums: Iterable[int], on_signal: Callable[[int], None], *,
                     name: str = "signals") -> None:
    """Call ``on_signal(signum)`` from a watcher thread for each of ``signums`` that arrives.

    Call it from the main thread (Python installs handlers only there). Signals among
    ``signums`` that a parent left blocked (to keep them pending through start-up) are
    unblocked last, once the watcher runs, so they are acted on, not lost."""
    wanted = frozenset(signums)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in wanted:
        signal.signal(signum, _ignore)

    def watch() -> None:
        while True:
            for signum in os.read(read_fd, 64):  # one byte per signal: its number
                if signum not in wanted:
                    continue
                try:
                    on_signal(signum)
                except Exception:  # noqa: BLE001 -- the next signal must still be heard
                    log.exception("signal-handling-failed")

    threading.Thread(target=watch, name=name, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)
