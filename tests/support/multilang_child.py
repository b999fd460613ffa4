"""A MultiLang child for tests, speaking the protocol by hand (no client library), well or badly on request.

    python -m tests.support.multilang_child [BEHAVIOUR]

Behaviours (``MULTILANG_CHILD`` or the first argument), each at the ``MULTILANG_FAIL_AT``-th processRecords (1):

* ``good``: checkpoints the last record of every batch; at shardEnded and shutdownRequested checkpoints ``null``;
* ``crash``: exits with code 3 in the middle of that batch (after its first record, before any checkpoint);
* ``garbage``: answers that batch with an unknown action;
* ``wrong-status``: answers that batch with a status for another action;
* ``beyond``: asks for a checkpoint one past the batch's last sequence number, then goes on as ``good``;
* ``silent``: never answers that batch;
* ``chatty``: prints lines of its own on stdout and stderr around every message, else ``good``;
* ``poison``: exits with code 3, before it handles any of them, on every batch that holds a record whose data starts
  with ``poison`` (whatever ``MULTILANG_FAIL_AT``), else ``good``.

With ``MULTILANG_FAIL_ONCE_DIR`` set, a failing behaviour fails once per shard (a marker file there remembers it),
so the shard's next child is good. Every record handled and every checkpoint answer is appended to the JSON-lines
file ``MULTILANG_JOURNAL`` (if set): ``{"kind": "record"|"checkpoint"|"message", ...}``.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _journal(entry: dict[str, Any]) -> None:
    path = os.environ.get("MULTILANG_JOURNAL")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({**entry, "pid": os.getpid()}) + "\n")


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write("\n" + json.dumps(message) + "\n")  # framed by blank lines, as kclpy does
    sys.stdout.flush()


def _read() -> dict[str, Any] | None:
    line = sys.stdin.readline()
    if not line:
        return None
    message: dict[str, Any] = json.loads(line)
    return message


def _checkpoint(sequence: str | None, sub: int | None) -> str | None:
    _send({"action": "checkpoint", "sequenceNumber": sequence, "subSequenceNumber": sub})
    reply = _read()
    error = None if reply is None else reply.get("error")
    _journal({"kind": "checkpoint", "sequence": sequence, "sub": sub, "error": error, "shard": SHARD[0]})
    return error


SHARD = ["?"]


def main() -> int:
    behaviour = (sys.argv[1] if len(sys.argv) > 1 else "") or os.environ.get("MULTILANG_CHILD", "good")
    fail_at = int(os.environ.get("MULTILANG_FAIL_AT", "1"))
    once_dir = os.environ.get("MULTILANG_FAIL_ONCE_DIR")
    batches = 0
    while True:
        message = _read()
        if message is None:
            return 0
        action = message["action"]
        if behaviour == "chatty":
            print(f"chatty child got {action}", flush=True)
            print(f"chatty child stderr for {action}", file=sys.stderr, flush=True)
        if action == "initialize":
            SHARD[0] = message["shardId"]
            _journal({"kind": "message", "action": action, "shard": SHARD[0], "sequence": message["sequenceNumber"]})
        elif action == "processRecords":
            batches += 1
            failing = batches == fail_at and behaviour not in ("good", "chatty", "poison")
            if failing and once_dir:
                marker = Path(once_dir) / f"{SHARD[0]}.{behaviour}"
                failing = not marker.exists()
                marker.touch()
            records = message["records"]
            if behaviour == "poison" and any(base64.b64decode(r["data"]).startswith(b"poison") for r in records):
                os._exit(3)
            for index, record in enumerate(records):
                _journal(
                    {
                        "kind": "record",
                        "shard": SHARD[0],
                        "sequence": record["sequenceNumber"],
                        "sub": record["subSequenceNumber"],
                        "data": base64.b64decode(record["data"]).decode("utf-8", "replace"),
                    }
                )
                if failing and behaviour == "crash" and index == 0:
                    os._exit(3)
            if failing and behaviour == "silent":
                time.sleep(3600)
            if failing and behaviour == "garbage":
                _send({"action": "bogus"})
                continue
            if failing and behaviour == "wrong-status":
                _send({"action": "status", "responseFor": "initialize"})
                continue
            if records:
                last = records[-1]
                if failing and behaviour == "beyond":
                    _checkpoint(str(int(last["sequenceNumber"]) + 1), 0)
                _checkpoint(last["sequenceNumber"], last["subSequenceNumber"])
        elif action in ("shardEnded", "shutdownRequested"):
            _journal({"kind": "message", "action": action, "shard": SHARD[0]})
            _checkpoint(None, None)
        else:
            _journal({"kind": "message", "action": action, "shard": SHARD[0]})
        _send({"action": "status", "responseFor": action})


if __name__ == "__main__":
    sys.exit(main())
