"""Run a moto server on a free loopback port, write the port to a file and serve until terminated.

Started as ``python -m worker_lib.testing._moto_server PORT_FILE [HOST]`` by :mod:`worker_lib.testing.emulators`,
so that worker processes, Spark's Python workers and the test process all talk to one server over HTTP. The port
goes through a file (written whole, then renamed) rather than stdout: moto and werkzeug write to stdout themselves.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sys
import threading
from pathlib import Path


def serialise_dynamodb() -> None:
    """One DynamoDB request at a time. moto's TransactWriteItems copies every table it touches and, when a condition
    fails, puts the copies back: a write another request thread made meanwhile would be undone (a lease renewal or
    checkpoint reverted, outputs left). DynamoDB's transactions are isolated; with this, moto's are too."""
    from moto.dynamodb.responses import DynamoHandler

    lock = threading.Lock()
    call_action = DynamoHandler.call_action

    def serialised(self: DynamoHandler) -> object:
        with lock:
            return call_action(self)

    DynamoHandler.call_action = serialised  # type: ignore[method-assign]


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    if len(sys.argv) < 2:
        logging.getLogger(__name__).error("usage: python -m worker_lib.testing._moto_server PORT_FILE [HOST]")
        return 2
    port_file = Path(sys.argv[1])
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    from moto.server import ThreadedMotoServer

    serialise_dynamodb()
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    with contextlib.redirect_stdout(io.StringIO()):  # moto prints a banner on start
        server.start()
    _, port = server.get_host_and_port()
    partial = port_file.with_name(port_file.name + ".tmp")
    partial.write_text(f"{port}\n")
    os.replace(partial, port_file)  # the parent never reads a half-written port
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
