"""Ctrl-C while llama.cpp holds the main thread in C code."""
from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def deferred_sigint():
    """Within the block, Ctrl-C on the main thread only sets the yielded Event (raise afterwards yourself).

    While llama.cpp loads a model or builds a context, Python runs only inside
    ctypes callbacks (logging, progress), and a KeyboardInterrupt raised there
    is swallowed by ctypes: Ctrl-C would be lost. Elsewhere (other threads, a
    custom SIGINT handler already installed) the Event just never gets set.
    """
    interrupted = threading.Event()
    own = (threading.current_thread() is threading.main_thread()
           and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if own:
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        yield interrupted
    finally:
        if own:
            signal.signal(signal.SIGINT, signal.default_int_handler)
