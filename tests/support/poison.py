"""A processor that cannot take some records (poison), for the failure-policy tests (docs/failures.md).

Which records are poison is a pure function of the record's id (``Producer`` ids ``r0000042``) and
``$POISON_SEED`` / ``$POISON_EVERY`` (one in N, seeded), or any id starting with ``poison``; the test computes the
same set. The processor is transactional, as a processor writing a batch in one database transaction is: a batch
that holds a poison record fails as a whole before anything of it is journaled (a ``FAIL`` line names the first
poison record), so a record journaled is a record processed, once. Once ``$POISON_FIXED_FILE`` exists (the operator
"fixed the processor") poison records are processed like any other.

Journal lines are the chaos suite's (tests/support/chaos.py): ``REC`` per record processed, ``FAIL`` per failed
delivery (``a`` = the batch's first sequence number, ``c`` = the first poison id in it).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from tests.support.chaos import ChaosProcessor
from worker_lib.processing.processor import ProcessRecordsInput

PROCESSOR = "tests.support.poison:PoisonProcessor"


def record_id(data: bytes) -> str:
    return data.decode().split("|", 1)[0]


def is_poison(identifier: str, *, seed: int, every: int) -> bool:
    """Whether the record with this id is poison: ``poison…`` ids always; ``r<number>`` ids one in ``every``."""
    if identifier.startswith("poison"):
        return True
    if every <= 0 or not identifier[1:].isdigit():
        return False
    return random.Random(f"{seed}:{int(identifier[1:])}").randrange(every) == 0


class PoisonProcessor(ChaosProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.seed = int(os.environ.get("POISON_SEED", "0"))
        self.every = int(os.environ.get("POISON_EVERY", "0"))
        fixed = os.environ.get("POISON_FIXED_FILE", "")
        self.fixed = Path(fixed) if fixed else None

    def process_records(self, input: ProcessRecordsInput) -> None:
        if self.fixed is None or not self.fixed.exists():
            for record in input.records:
                identifier = record_id(record.data)
                if is_poison(identifier, seed=self.seed, every=self.every):
                    first = input.records[0]
                    self._append([self._line(input.shard_id, "FAIL", first.sequence_number, "0", identifier)])
                    raise ValueError("cannot parse this record")  # the poison: nothing of the batch is written
        super().process_records(input)
