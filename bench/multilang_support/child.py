"""The MultiLang side of bench/multilang.py: a child that does nothing but checkpoint each batch.

Plain Python speaking the protocol (what kclpy's KCLProcess does, minus its dispatch layers): decode each message,
checkpoint the last record of every batch, answer with a status. The first record's wall time goes to
``BENCH_FIRST_RECORD_FILE``.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    first_file = os.environ.get("BENCH_FIRST_RECORD_FILE")
    noted = False
    read, write = sys.stdin.readline, sys.stdout.write
    while True:
        line = read()
        if not line:
            return 0
        message = json.loads(line)
        action = message["action"]
        if action == "processRecords" and message["records"]:
            if not noted and first_file:
                noted = True
                with open(first_file, "a", encoding="utf-8") as out:
                    out.write(f"{time.time()}\n")
            last = message["records"][-1]
            write(
                json.dumps(
                    {
                        "action": "checkpoint",
                        "sequenceNumber": last["sequenceNumber"],
                        "subSequenceNumber": last["subSequenceNumber"],
                    }
                )
                + "\n"
            )
            sys.stdout.flush()
            read()  # the checkpoint's answer
        elif action in ("shardEnded", "shutdownRequested"):
            write('{"action": "checkpoint", "sequenceNumber": null, "subSequenceNumber": null}\n')
            sys.stdout.flush()
            read()
        write(json.dumps({"action": "status", "responseFor": action}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
