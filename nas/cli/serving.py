"""``nas dashboard``'s web server: optuna-dashboard's WSGI app served until Ctrl-C, which always stops it.

optuna-dashboard's ``run_server`` serves through bottle's ``run`` on ``wsgiref`` in the main thread: a Ctrl-C that
lands while a request is being answered raises inside ``wsgiref``'s handler, which prints the ``KeyboardInterrupt``
traceback as a failed request and serves on (a stop lost); one between requests made ``run`` return, and the command
exited 0. Here the server runs in a thread of its own and the main thread only waits for SIGINT: the signal sets an
event, never raises inside a request, and the server is shut down after the request it is answering.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

WSGIApp = Callable[..., Any]
POLL_S = 0.2  # how often the serving thread looks for the shutdown request


def serve_until_interrupted(app: WSGIApp, host: str, port: int) -> bool:
    """Serve ``app`` on ``host:port`` (IPv6 when ``host`` holds a colon) until SIGINT, and close it: True. False when
    the server's thread ended by itself (an error it could not handle; its traceback is on stderr)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (WSGIServer,), {"address_family": family})
    httpd = make_server(host, port, app, server_class=server_class, handler_class=WSGIRequestHandler)
    stopped = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stopped.set())
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": POLL_S}, name="dashboard",
                               daemon=True)
    try:
        serving.start()
        while serving.is_alive():
            if stopped.wait(POLL_S):  # SIGINT came
                break
    finally:
        if serving.is_alive():
            httpd.shutdown()  # after the request it is answering
        httpd.server_close()
        signal.signal(signal.SIGINT, previous)
    return stopped.is_set()
