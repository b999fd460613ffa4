"""Run a moto server on a free loopback port; print ``READY <port>`` and serve until terminated.

Started as ``python -m worker_lib.testing._moto_server`` by :mod:`worker_lib.testing.emulators`, so that worker
processes, Spark's Python workers and the test process all talk to one server over HTTP.
"""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import sys
import threading


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    with contextlib.redirect_stdout(io.StringIO()):  # moto prints a banner on start
        server.start()
    _, port = server.get_host_and_port()
    print(f"READY {port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
