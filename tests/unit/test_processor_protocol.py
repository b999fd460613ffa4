"""The record-processor protocol: loading MODULE:ATTR specs, the plain-function adapter, checkpoint value rules."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.checkpointers import RecordingCheckpointer
from worker_lib.core.errors import ConfigError, ShardleaseError
from worker_lib.core.models import SHARD_END, Checkpoint
from worker_lib.processing.processor import (
    Checkpointer,
    CheckpointError,
    FunctionProcessor,
    InitializationInput,
    InvalidCheckpointError,
    KinesisRecord,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownError,
    ShutdownRequestedInput,
    load_processor,
    validate_checkpoint_value,
)

PROCESSORS = """
from worker_lib.processing.processor import FunctionProcessor

class Good:
    instances = 0
    def __init__(self):
        Good.instances += 1
    def initialize(self, input): pass
    def process_records(self, input): pass
    def lease_lost(self, input): pass
    def shard_ended(self, input): input.checkpointer.checkpoint()
    def shutdown_requested(self, input): pass

class Outer:
    Inner = Good

class Incomplete:
    def initialize(self, input): pass
    def process_records(self, input): pass

class NeedsArgs(Good):
    def __init__(self, url):
        self.url = url

def make():
    return Good()

def make_wrong():
    return 42

def handle(records, checkpointer):
    pass

def three(a, b, c):
    pass

instance = Good()
number = 7
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh importable module of user processors; plus a broken one and one with a missing dependency."""
    name = f"user_processors_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(PROCESSORS)
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('config file\\nnot found')\n")
    (tmp_path / f"{name}_deps.py").write_text("import surely_not_installed_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for suffix in ("", "_broken", "_deps"):
        sys.modules.pop(name + suffix, None)


# --- load_processor: good specs ------------------------------------------------------------------------------


def test_class_spec_makes_one_instance_per_call(user_module: str) -> None:
    # GIVEN a spec naming a processor class
    factory = load_processor(f"{user_module}:Good")
    # WHEN the worker makes processors for two leases
    first, second = factory(), factory()
    # THEN each lease gets its own instance of the class
    assert first is not second
    assert isinstance(first, RecordProcessor)
    assert type(first).__name__ == "Good"


def test_nested_class_spec(user_module: str) -> None:
    assert type(load_processor(f"{user_module}:Outer.Inner")()).__name__ == "Good"


def test_factory_function_spec(user_module: str) -> None:
    # GIVEN a spec naming a factory taking no arguments
    factory = load_processor(f"{user_module}:make")
    # THEN calling it yields record processors
    assert isinstance(factory(), RecordProcessor)


def test_handle_function_spec_is_wrapped(user_module: str) -> None:
    # GIVEN a spec naming a plain handle(records, checkpointer) function
    factory = load_processor(f" {user_module}:handle ")
    # THEN each call wraps it in a fresh FunctionProcessor
    made = factory()
    assert isinstance(made, FunctionProcessor)
    assert made is not factory()
    assert made.handle.__name__ == "handle"


def test_factory_returning_something_else_fails_when_called(user_module: str) -> None:
    # GIVEN a factory whose result is not a record processor (only knowable by calling it)
    factory = load_processor(f"{user_module}:make_wrong")
    # WHEN it is used THEN one clear ConfigError line says so
    with pytest.raises(ConfigError) as info:
        factory()
    assert_one_line(info.value, "returned a int, not a record processor")


# --- load_processor: bad specs -------------------------------------------------------------------------------


def assert_one_line(error: BaseException, fragment: str) -> None:
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith("invalid processor "), message
    assert fragment in message, message


@pytest.mark.parametrize(
    ("attr", "fragment"),
    [
        ("Missing", "has no attribute 'Missing'"),
        ("Outer.Nope", "'Outer' has no attribute 'Nope'"),
        ("Incomplete", "class Incomplete is not a record processor (missing lease_lost, shard_ended"),
        ("NeedsArgs", "class NeedsArgs must be constructible without arguments"),
        ("instance", "is a record processor instance; expected a record-processor class"),
        ("number", "number is a int; expected"),
        ("three", "takes neither no arguments (a factory) nor (records, checkpointer)"),
    ],
)
def test_bad_attribute_gives_one_line(user_module: str, attr: str, fragment: str) -> None:
    # GIVEN a spec whose module imports but whose attribute is wrong
    # WHEN it is loaded THEN a single ConfigError line names the problem
    with pytest.raises(ConfigError) as info:
        load_processor(f"{user_module}:{attr}")
    assert_one_line(info.value, fragment)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("no_colon_here", "expected MODULE:ATTR"),
        (":Good", "expected MODULE:ATTR"),
        ("module_only:", "expected MODULE:ATTR"),
        ("", "expected MODULE:ATTR"),
        ("surely_missing_module_abc:Thing", "no module named 'surely_missing_module_abc'"),
        ("surely_missing_pkg_abc.sub:Thing", "no module named 'surely_missing_pkg_abc'"),
    ],
)
def test_bad_spec_gives_one_line(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_processor(spec)
    assert_one_line(info.value, fragment)


def test_module_failing_at_import_gives_one_line(user_module: str) -> None:
    # GIVEN a user module that raises (with a multi-line message) while importing
    with pytest.raises(ConfigError) as info:
        load_processor(f"{user_module}_broken:Thing")
    # THEN the error is one line naming the module and the first line of the cause
    assert_one_line(info.value, f"importing '{user_module}_broken' failed: RuntimeError: config file")


def test_module_with_missing_dependency_names_the_dependency(user_module: str) -> None:
    # GIVEN a user module that exists but imports something not installed
    with pytest.raises(ConfigError) as info:
        load_processor(f"{user_module}_deps:Thing")
    # THEN the message blames the dependency, not the user's module
    assert_one_line(info.value, "ModuleNotFoundError: No module named 'surely_not_installed_dependency_xyz'")


def test_checkpoint_errors_belong_to_the_hierarchy() -> None:
    assert issubclass(ShutdownError, CheckpointError)
    assert issubclass(InvalidCheckpointError, CheckpointError)
    assert issubclass(CheckpointError, ShardleaseError)
    assert issubclass(InvalidCheckpointError, ValueError)


# --- checkpoint value rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sequence", "sub", "last", "largest", "fragment"),
    [
        ("100", 0, Checkpoint(sequence="200"), Checkpoint(sequence="300"), "before the last checkpoint"),
        ("200", 1, Checkpoint(sequence="200", sub_sequence=2), Checkpoint(sequence="300"), "before the last"),
        ("301", 0, None, Checkpoint(sequence="300"), "beyond the last delivered record 300"),
        ("300", 5, None, Checkpoint(sequence="300", sub_sequence=4), "beyond the last delivered record 300/4"),
        ("100", 0, None, None, "none delivered"),
        ("SHARD_END", 0, None, Checkpoint(sequence="300"), "only be checkpointed once the shard has ended"),
        ("LATEST", 0, None, Checkpoint(sequence="300"), "'LATEST' is not a sequence number"),
        ("12a", 0, None, Checkpoint(sequence="300"), "is not a sequence number"),
        ("100", -1, None, Checkpoint(sequence="300"), "negative"),
        ("250", 0, SHARD_END, SHARD_END, "before the last checkpoint SHARD_END"),
    ],
)
def test_out_of_range_checkpoints_are_rejected(
    sequence: str, sub: int, last: Checkpoint | None, largest: Checkpoint | None, fragment: str
) -> None:
    with pytest.raises(InvalidCheckpointError, match=fragment.replace("(", r"\(")):
        validate_checkpoint_value(sequence, sub, last_checkpoint=last, largest_permitted=largest)


@pytest.mark.parametrize(
    ("sequence", "sub", "last", "largest"),
    [
        ("200", 0, Checkpoint(sequence="200"), Checkpoint(sequence="300")),  # same as last: allowed (no-op)
        ("300", 4, Checkpoint(sequence="TRIM_HORIZON"), Checkpoint(sequence="300", sub_sequence=4)),
        ("250", 0, None, SHARD_END),  # at shard end anything up to SHARD_END
        ("SHARD_END", 0, Checkpoint(sequence="250"), SHARD_END),
        ("SHARD_END", 0, SHARD_END, SHARD_END),  # repeating SHARD_END is harmless
    ],
)
def test_in_range_checkpoints_are_accepted(
    sequence: str, sub: int, last: Checkpoint | None, largest: Checkpoint
) -> None:
    value = validate_checkpoint_value(sequence, sub, last_checkpoint=last, largest_permitted=largest)
    assert value == Checkpoint(sequence=sequence, sub_sequence=sub)


# --- FunctionProcessor ---------------------------------------------------------------------------------------


def records(*positions: tuple[str, int]) -> list[KinesisRecord]:
    return [
        KinesisRecord(data=b"x", partition_key="k", sequence_number=seq, sub_sequence_number=sub)
        for seq, sub in positions
    ]


def deliver(processor: FunctionProcessor, cp: RecordingCheckpointer, batch: Sequence[KinesisRecord]) -> None:
    if batch:
        cp.largest_permitted = batch[-1].checkpoint
    processor.process_records(ProcessRecordsInput(shard_id="shardId-1", records=batch, checkpointer=cp))


def test_recording_checkpointer_satisfies_the_protocol() -> None:
    assert isinstance(RecordingCheckpointer(), Checkpointer)


def test_function_processor_passes_batches_and_skips_empty_ones() -> None:
    # GIVEN a plain function wrapped as a processor
    seen: list[list[str]] = []
    processor = FunctionProcessor(lambda recs, _cp: seen.append([r.sequence_number for r in recs]))
    cp = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id="shardId-1", checkpoint=Checkpoint(sequence="TRIM_HORIZON")))
    # WHEN it is given a batch, an empty batch and another batch
    deliver(processor, cp, records(("1", 0), ("2", 0)))
    deliver(processor, cp, [])
    deliver(processor, cp, records(("3", 0)))
    # THEN the function sees the two real batches, and nothing was checkpointed on its behalf
    assert seen == [["1", "2"], ["3"]]
    assert cp.written == []
    assert processor.shard_id == "shardId-1"


def test_function_processor_checkpoints_shard_end_for_the_function() -> None:
    # GIVEN a function that never checkpoints, at the end of a closed shard
    processor = FunctionProcessor(lambda _recs, _cp: None)
    cp = RecordingCheckpointer()
    deliver(processor, cp, records(("5", 0)))
    cp.largest_permitted = SHARD_END
    # WHEN the shard ends
    processor.shard_ended(ShardEndedInput(shard_id="shardId-1", checkpointer=cp, child_shard_ids=("shardId-2",)))
    # THEN SHARD_END is checkpointed, so the children can start
    assert cp.written == [SHARD_END]


def test_function_processor_checkpoints_handled_records_on_shutdown_request() -> None:
    # GIVEN two batches handled, the second being an aggregate's sub-records
    processor = FunctionProcessor(lambda _recs, _cp: None)
    cp = RecordingCheckpointer()
    deliver(processor, cp, records(("7", 0)))
    deliver(processor, cp, records(("9", 0), ("9", 1), ("9", 2)))
    # WHEN a shutdown is requested (handoff or SIGTERM)
    processor.shutdown_requested(ShutdownRequestedInput(shard_id="shardId-1", checkpointer=cp))
    # THEN the last handled record, sub-sequence included, is checkpointed, once
    processor.shutdown_requested(ShutdownRequestedInput(shard_id="shardId-1", checkpointer=cp))
    assert cp.written == [Checkpoint(sequence="9", sub_sequence=2)]


def test_function_processor_never_checkpoints_a_failed_batch() -> None:
    # GIVEN a function that fails on its second batch
    def handle(recs: Sequence[KinesisRecord], _cp: Checkpointer) -> None:
        if recs[0].sequence_number == "20":
            raise RuntimeError("downstream unavailable")

    processor = FunctionProcessor(handle)
    cp = RecordingCheckpointer()
    deliver(processor, cp, records(("10", 0)))
    # WHEN the second batch fails THEN the error reaches the consumer
    with pytest.raises(RuntimeError, match="downstream"):
        deliver(processor, cp, records(("20", 0)))
    processor.shutdown_requested(ShutdownRequestedInput(shard_id="shardId-1", checkpointer=cp))
    # AND only the batch that succeeded is checkpointed
    assert cp.written == [Checkpoint(sequence="10")]


def test_function_processor_respects_the_functions_own_checkpoints() -> None:
    # GIVEN a function that checkpoints its records itself
    processor = FunctionProcessor(lambda recs, c: c.checkpoint_record(recs[-1]))
    cp = RecordingCheckpointer()
    deliver(processor, cp, records(("3", 0), ("4", 0)))
    # WHEN shutdown is requested THEN no second, redundant checkpoint is written
    processor.shutdown_requested(ShutdownRequestedInput(shard_id="shardId-1", checkpointer=cp))
    assert cp.written == [Checkpoint(sequence="4")]


def test_function_processor_can_checkpoint_every_batch() -> None:
    processor = FunctionProcessor(lambda _recs, _cp: None, checkpoint_every_batch=True)
    cp = RecordingCheckpointer()
    deliver(processor, cp, records(("1", 0)))
    deliver(processor, cp, records(("2", 0), ("2", 1)))
    assert cp.written == [Checkpoint(sequence="1"), Checkpoint(sequence="2", sub_sequence=1)]


def test_function_processor_after_lease_lost_does_not_checkpoint() -> None:
    # GIVEN a lease lost after a batch was handled
    processor = FunctionProcessor(lambda _recs, _cp: None)
    cp = RecordingCheckpointer()
    deliver(processor, cp, records(("1", 0)))
    processor.lease_lost(LeaseLostInput(shard_id="shardId-1"))
    cp.lease_lost = True
    # WHEN (wrongly) asked to shut down afterwards THEN it attempts nothing that could raise
    processor.shutdown_requested(ShutdownRequestedInput(shard_id="shardId-1", checkpointer=cp))
    assert cp.written == []


def test_function_processor_is_a_record_processor() -> None:
    processor = FunctionProcessor(lambda _recs, _cp: None)
    assert isinstance(processor, RecordProcessor)
    assert "FunctionProcessor(" in repr(processor)
