"""A checkpointer for tests of processors, with the real value rules and no lease table."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.processor import PreparedCheckpointer, ShutdownError, validate_checkpoint_value


@dataclass
class RecordingCheckpointer:
    """A Checkpointer that enforces the value rules and records what was written."""

    largest_permitted: Checkpoint | None = None
    written: list[Checkpoint] = field(default_factory=list)
    lease_lost: bool = False

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        return self.written[-1] if self.written else None

    def checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None:
        if self.lease_lost:
            raise ShutdownError("lease lost")
        if sequence is None:
            assert self.largest_permitted is not None
            sequence, sub_sequence = self.largest_permitted.sequence, self.largest_permitted.sub_sequence
        self.written.append(
            validate_checkpoint_value(
                sequence, sub_sequence, last_checkpoint=self.last_checkpoint, largest_permitted=self.largest_permitted
            )
        )

    def checkpoint_record(self, record: KinesisRecord) -> None:
        self.checkpoint(record.sequence_number, record.sub_sequence_number)

    def prepare_checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> PreparedCheckpointer:
        raise NotImplementedError

    def prepare_checkpoint_record(self, record: KinesisRecord) -> PreparedCheckpointer:
        raise NotImplementedError
