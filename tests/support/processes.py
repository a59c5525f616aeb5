"""Helpers for the servers tests start (not a pytest plugin, so any test module may import it)."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to the child when the test process dies, even if killed, so a
    crashed test session never leaves a server behind. The kernel ties this to the *thread* that started the
    child: start servers from a thread that outlives them (the main thread)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
