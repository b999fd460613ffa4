"""Staged DynamoDB outputs and how they are cut into transactions (pure logic: no AWS)."""

from __future__ import annotations

import pytest

from worker_lib.core.models import SHARD_END, TRIM_HORIZON, Checkpoint
from worker_lib.processing.outputs import (
    MAX_TRANSACTION_ACTIONS,
    MAX_TRANSACTION_BYTES,
    OutputTooLargeError,
    StagedOutputs,
    condition_check,
    delete_item,
    plan_commits,
    put_item,
    update_item,
)
from worker_lib.processing.positions import later_start


def at(n: int, sub: int = 0) -> Checkpoint:
    return Checkpoint(sequence=str(1000 + n), sub_sequence=sub)


def keys(table: str) -> tuple[str, ...]:
    return ("pk",)


def test_helpers_build_typed_transaction_actions() -> None:
    # GIVEN plain Python values WHEN actions are built THEN they are TransactWriteItems actions with typed values
    assert put_item("t", {"pk": "a", "n": 2}, condition="attribute_not_exists(pk)") == {
        "Put": {
            "TableName": "t",
            "Item": {"pk": {"S": "a"}, "n": {"N": "2"}},
            "ConditionExpression": "attribute_not_exists(pk)",
        }
    }
    assert update_item("t", {"pk": "a"}, "ADD #n :one", names={"#n": "n"}, values={":one": 1})["Update"] == {
        "TableName": "t",
        "Key": {"pk": {"S": "a"}},
        "UpdateExpression": "ADD #n :one",
        "ExpressionAttributeNames": {"#n": "n"},
        "ExpressionAttributeValues": {":one": {"N": "1"}},
    }
    assert delete_item("t", {"pk": "a"}) == {"Delete": {"TableName": "t", "Key": {"pk": {"S": "a"}}}}
    assert condition_check("t", {"pk": "a"}, "attribute_exists(pk)")["ConditionCheck"]["ConditionExpression"] == (
        "attribute_exists(pk)"
    )


def test_staging_refuses_what_is_not_an_action_and_what_cannot_fit_one_transaction() -> None:
    # GIVEN an empty stage
    staged = StagedOutputs(lambda: None)
    # WHEN something that is not one action is staged THEN it is refused with a clear error
    with pytest.raises(ValueError, match="one TransactWriteItems action"):
        staged.stage(at(1), [{"Put": {}, "Delete": {}}])
    with pytest.raises(ValueError, match="TableName"):
        staged.stage(at(1), [{"Put": {"Item": {}}}])
    # AND one record's 100 outputs cannot share a transaction with the checkpoint
    with pytest.raises(OutputTooLargeError, match="99 actions"):
        staged.stage(at(1), [put_item("t", {"pk": str(i)}) for i in range(MAX_TRANSACTION_ACTIONS)])
    # AND nothing was staged
    assert len(staged) == 0


def test_outputs_of_a_record_already_checkpointed_are_not_staged_again() -> None:
    # GIVEN a lease checkpointed at record 5 (its outputs committed with it)
    staged = StagedOutputs(lambda: at(5))
    # WHEN a batch delivered again stages records 4..6
    for n in (4, 5, 6):
        staged.stage(at(n), [put_item("t", {"pk": str(n)})])
    # THEN only record 6's output waits for a commit
    assert [entry.position for entry in staged.up_to(at(9))] == [at(6)]


def test_a_failed_delivery_discards_what_its_records_staged() -> None:
    # GIVEN outputs staged for records 1..3 (from the start: no checkpoint yet)
    staged = StagedOutputs(lambda: TRIM_HORIZON)
    for n in (1, 2, 3):
        staged.stage(at(n), [put_item("t", {"pk": str(n)})])
    # WHEN the delivery of records 2..3 failed
    dropped = staged.discard([at(2), at(3)])
    # THEN only record 1's output is left
    assert dropped == 2
    assert [entry.position for entry in staged.up_to(SHARD_END)] == [at(1)]


def test_a_checkpoint_commits_the_records_up_to_it_in_order() -> None:
    # GIVEN outputs for records 3, 1, 2, 7 (lanes stage out of order)
    staged = StagedOutputs(lambda: None)
    for n in (3, 1, 2, 7):
        staged.stage(at(n), [put_item("t", {"pk": str(n)})])
    # WHEN a checkpoint at record 3 is planned
    plans = plan_commits(staged.up_to(at(3)), at(3), key_names=keys)
    # THEN one transaction carries records 1, 2, 3 and checkpoints at 3; record 7 waits
    assert len(plans) == 1
    assert plans[0].checkpoint == at(3)
    assert [w["Put"]["Item"]["pk"]["S"] for w in plans[0].writes] == ["1", "2", "3"]
    staged.committed(plans[0].covers)
    assert [entry.position for entry in staged.up_to(SHARD_END)] == [at(7)]


def test_more_than_99_outputs_are_cut_at_record_boundaries_each_checkpointing_its_last_record() -> None:
    # GIVEN 30 records with 4 outputs each (120 actions)
    staged = StagedOutputs(lambda: None)
    for n in range(30):
        staged.stage(at(n), [put_item("t", {"pk": f"{n}-{i}"}) for i in range(4)])
    # WHEN a checkpoint past them all (at record 40) is planned
    plans = plan_commits(staged.up_to(at(40)), at(40), key_names=keys)
    # THEN the first transaction holds 24 whole records (96 actions) and checkpoints at its last record
    assert [len(plan.writes) for plan in plans] == [96, 24]
    assert plans[0].checkpoint == at(23)
    # AND the last one ends at the checkpoint asked for
    assert plans[1].checkpoint == at(40)
    assert all(len(plan.writes) + 1 <= MAX_TRANSACTION_ACTIONS for plan in plans)


def test_two_actions_on_one_item_go_to_consecutive_transactions() -> None:
    # GIVEN records 1 and 2 both updating item "hot" (DynamoDB refuses two actions on one item in a transaction)
    staged = StagedOutputs(lambda: None)
    staged.stage(at(1), [update_item("t", {"pk": "hot"}, "ADD n :one", values={":one": 1})])
    staged.stage(at(2), [put_item("t", {"pk": "hot", "n": 5})])
    # WHEN planned
    plans = plan_commits(staged.up_to(at(2)), at(2), key_names=keys)
    # THEN they are committed one after the other, each with its own record's checkpoint
    assert [plan.checkpoint for plan in plans] == [at(1), at(2)]
    # AND one record touching one item twice is refused
    staged.stage(at(3), [put_item("t", {"pk": "x"}), delete_item("t", {"pk": "x"})])
    with pytest.raises(OutputTooLargeError, match="one item"):
        plan_commits(staged.up_to(at(3)), at(3), key_names=keys)


def test_transactions_stay_under_four_megabytes() -> None:
    # GIVEN 12 records with one 390 kB item each (DynamoDB's item limit is 400 kB)
    staged = StagedOutputs(lambda: None)
    for n in range(12):
        staged.stage(at(n), [put_item("t", {"pk": str(n), "blob": "x" * 390_000})])
    # WHEN planned THEN every transaction holds at most 4 MB of items
    plans = plan_commits(staged.up_to(at(11)), at(11), key_names=keys)
    assert len(plans) == 2
    assert all(sum(len(w["Put"]["Item"]["blob"]["S"]) for w in plan.writes) < MAX_TRANSACTION_BYTES for plan in plans)
    assert sum(len(plan.writes) for plan in plans) == 12


def test_the_consumer_starts_after_the_later_of_checkpoint_and_sink_position() -> None:
    # GIVEN/WHEN/THEN: the sink ahead wins, the checkpoint ahead wins, sentinels lose to any position
    assert later_start(at(3), at(5)) == at(5)
    assert later_start(at(5), at(3)) == at(5)
    assert later_start(TRIM_HORIZON, at(1)) == at(1)
    assert later_start(at(2), None) == at(2)
    assert later_start(SHARD_END, at(9)) == SHARD_END
