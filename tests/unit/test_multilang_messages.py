"""The MultiLang protocol's lines, against lines recorded from KCL's daemon and from kclpy's and aws-kcl's children."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.multilang import messages
from worker_lib.multilang.messages import CheckpointRequest, ChildOutput, ProtocolError, Status

# Lines as KCL 3.x's MultiLangDaemon writes them (Jackson; field order differs, which JSON ignores).
KCL3_INITIALIZE = (
    '{"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}'
)
KCL3_PROCESS_RECORDS = (
    '{"action":"processRecords","records":[{"data":"bWVvdw==","partitionKey":"cat","sequenceNumber":'
    '"49590338271490256608559692538361571095921575989136588898","approximateArrivalTimestamp":1700000000000,'
    '"subSequenceNumber":0,"action":"record"}],"millisBehindLatest":0}'
)
KCL3_CHECKPOINT_OK = '{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}'
KCL3_CHECKPOINT_REFUSED = (
    '{"action":"checkpoint","sequenceNumber":"123","subSequenceNumber":null,"error":"IllegalArgumentException"}'
)


def same(line: str, recorded: str) -> bool:
    return bool(json.loads(line) == json.loads(recorded))


def test_initialize_is_the_line_kcl3_writes() -> None:
    # GIVEN a new lease at TRIM_HORIZON  WHEN its initialize line is written  THEN it is KCL 3.x's, one line
    line = messages.encode(messages.initialize_message("shardId-000000000001", Checkpoint(sequence="TRIM_HORIZON")))
    assert line.endswith("\n") and line.count("\n") == 1
    assert same(line, KCL3_INITIALIZE)


def test_process_records_is_the_line_kcl3_writes() -> None:
    # GIVEN one record as GetRecords returned it
    record = KinesisRecord(
        data=b"meow",
        partition_key="cat",
        sequence_number="49590338271490256608559692538361571095921575989136588898",
        approximate_arrival_timestamp=datetime.fromtimestamp(1_700_000_000, timezone.utc),
    )
    # WHEN its processRecords line is written  THEN it is KCL 3.x's: base64 data, epoch-millis arrival, "record"
    assert same(messages.encode(messages.process_records_message([record], 0)), KCL3_PROCESS_RECORDS)


def test_a_deaggregated_record_carries_its_sub_sequence_number() -> None:
    record = KinesisRecord(data=b"x", partition_key="k", sequence_number="5", sub_sequence_number=7, aggregated=True)
    assert messages.record_message(record)["subSequenceNumber"] == 7


@pytest.mark.parametrize(
    ("generation", "lost", "ended"),
    [
        (2, {"action": "leaseLost"}, {"action": "shardEnded"}),
        (1, {"action": "shutdown", "reason": "ZOMBIE"}, {"action": "shutdown", "reason": "TERMINATE"}),
    ],
)
def test_each_generation_ends_a_processor_its_own_way(
    generation: messages.Generation, lost: dict[str, str], ended: dict[str, str]
) -> None:
    # GIVEN a daemon speaking generation `generation` (2: KCL 2.1+ and 3.x; 1: KCL 1.x and 2.0)
    # THEN lease loss and shard end are the messages that generation's clients expect
    assert messages.lease_lost_message(generation) == lost
    assert messages.shard_ended_message(generation) == ended
    assert messages.shutdown_requested_message() == {"action": "shutdownRequested"}


def test_checkpoint_replies_are_the_lines_kcl3_writes() -> None:
    assert same(messages.encode(messages.checkpoint_reply(None, None, None)), KCL3_CHECKPOINT_OK)
    assert same(
        messages.encode(messages.checkpoint_reply("123", None, "IllegalArgumentException")), KCL3_CHECKPOINT_REFUSED
    )


@pytest.mark.parametrize(
    ("line", "meaning"),
    [
        # kclpy: every message framed by blank lines; checkpoint() sends both keys, null for "the last record"
        ('{"action": "status", "responseFor": "initialize"}\n', Status(response_for="initialize")),
        (
            '{"action": "checkpoint", "sequenceNumber": null, "subSequenceNumber": null}\n',
            CheckpointRequest(sequence=None, sub_sequence=None),
        ),
        (
            '{"action": "checkpoint", "sequenceNumber": "4959", "subSequenceNumber": 3}\n',
            CheckpointRequest(sequence="4959", sub_sequence=3),
        ),
        # aws-kcl: no subSequenceNumber at all
        ('{"action":"checkpoint","sequenceNumber":"4959"}\n', CheckpointRequest(sequence="4959", sub_sequence=None)),
        ('{"action":"checkpoint"}\n', CheckpointRequest(sequence=None, sub_sequence=None)),
        # not messages: the framing's blank lines, and a child's own print()
        ("\n", ChildOutput(text="")),
        (
            "Encountered shutdown exception, skipping checkpoint\n",
            ChildOutput(text="Encountered shutdown exception, skipping checkpoint"),
        ),
        ("{not json\n", ChildOutput(text="{not json")),
        ("[1, 2]\n", ChildOutput(text="[1, 2]")),
    ],
)
def test_child_lines_mean_what_kcl_takes_them_for(line: str, meaning: messages.ChildLine) -> None:
    assert messages.decode(line) == meaning


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"action": "bogus"}', "unknown action 'bogus'"),
        ('{"responseFor": "initialize"}', "unknown action None"),
        ('{"action": "status"}', "without responseFor"),
        ('{"action": "checkpoint", "sequenceNumber": 1.5}', "is not a string"),
        ('{"action": "checkpoint", "sequenceNumber": "1", "subSequenceNumber": "2"}', "not a whole number"),
        ('{"action": "checkpoint", "sequenceNumber": true}', "is not a string"),
    ],
)
def test_a_json_object_that_is_no_message_is_a_protocol_error(line: str, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment.replace("(", r"\(")):
        messages.decode(line)


def test_a_protocol_error_never_quotes_record_data() -> None:
    with pytest.raises(ProtocolError) as caught:
        messages.decode('{"action": "status", "responseFor": 1, "data": "secret-payload"}')
    assert "secret-payload" not in str(caught.value)
