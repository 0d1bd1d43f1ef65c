"""A threading HTTP server for the test fakes that does not print a traceback when a client hangs up.

Download tests cut connections on purpose (resume, Ctrl-C, faults); ``socketserver`` would print each reset.
"""
from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class QuietHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` whose ``handle_error`` stays quiet for connections the client reset or closed."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)
