"""core/signals.py: signals acted on by a watcher thread. Each case runs in its own process,
since handlers and the wakeup pipe are per process."""

from __future__ import annotations

import subprocess
import sys


def run_probe(tmp_path, body: str) -> str:
    script = tmp_path / "probe.py"
    script.write_text("import os, signal, threading, time\n"
                      "from slurm_gpushare.core import signals\n" + body)
    probe = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = probe.communicate(timeout=20)
    finally:
        probe.kill()  # a deadlocked probe may ignore SIGTERM
    assert probe.returncode == 0, err
    return out.strip()


def test_the_callback_runs_while_the_interrupted_thread_holds_the_lock_it_needs(tmp_path):
    # A handler would run inside the main thread, which holds `lock`: a deadlock.
    assert run_probe(tmp_path, (
        "lock, done = threading.Lock(), threading.Event()\n"
        "def on_signal(signum):\n"
        "    with lock:\n"
        "        done.set()\n"
        "signals.handle_in_thread([signal.SIGUSR1], on_signal)\n"
        "with lock:\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    time.sleep(0.2)\n"
        "print('handled' if done.wait(5) else 'lost', flush=True)\n")) == "handled"


def test_a_signal_kept_blocked_through_start_up_is_acted_on_once_the_watcher_runs(tmp_path):
    assert run_probe(tmp_path, (
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # would kill us unblocked and unhandled\n"
        "got = threading.Event()\n"
        "signals.handle_in_thread([signal.SIGTERM], lambda signum: got.set())\n"
        "print('handled' if got.wait(5) else 'lost', flush=True)\n")) == "handled"


def test_a_failing_callback_does_not_deafen_the_watcher(tmp_path):
    assert run_probe(tmp_path, (
        "seen = []\n"
        "def on_signal(signum):\n"
        "    seen.append(signum)\n"
        "    if len(seen) == 1:\n"
        "        raise RuntimeError('first one fails')\n"
        "signals.handle_in_thread([signal.SIGHUP], on_signal)\n"
        "for _ in range(2):\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "    time.sleep(0.3)\n"
        "print(len(seen), flush=True)\n")) == "2"
