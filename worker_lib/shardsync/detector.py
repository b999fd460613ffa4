"""Listing a stream's shards: ListShards with pagination, throttling backoff and retries while the stream updates.

Follow-up pages pass ``NextToken`` and ``MaxResults`` only (AWS rejects ``NextToken`` together with
``StreamName``). moto differs: its page tokens carry a checksum of the *first* call's parameters and it answers
``InvalidToken`` unless ``StreamName`` and ``MaxResults`` are repeated; when an endpoint answers a follow-up page
that way, the detector repeats the first call's parameters for the rest of the listing (tests run on both). A
listing that could not be finished is reported as incomplete, never as a shorter list, so that cleanup never
mistakes "not listed" for "gone"; an expired page token restarts the listing once. Throttling
(``LimitExceededException`` and the like) and ``ResourceInUseException`` (stream updating) are retried with
exponential backoff on the injected clock; a missing stream raises :class:`~worker_lib.core.errors.StreamMissingError`;
everything else is translated by :mod:`worker_lib.core.aws`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import boto3
import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.backoff import Backoff
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import DependencyError, ThrottledError
from worker_lib.core.models import ShardInfo

log = logging.getLogger(__name__)

_RETRY_CODES = frozenset({"LimitExceededException", "ResourceInUseException"}) | aws.THROTTLING_CODES


@dataclass(frozen=True, kw_only=True)
class ShardListing:
    shards: tuple[ShardInfo, ...]
    complete: bool = True
    pages: int = 1


class ShardDetector(Protocol):
    def list_shards(self) -> ShardListing:
        """Every shard of the stream; ``complete=False`` when the listing could not be finished."""
        ...

    def shard_exists(self, shard_id: str) -> bool | None:
        """Whether the service still knows ``shard_id``: True, False (it says "not found"), None (could not tell).

        Asked only for leases whose shard a complete listing did not return, before such a lease is deleted.
        """
        ...


def shard_from_response(raw: dict[str, Any]) -> ShardInfo:
    hashes = raw.get("HashKeyRange", {})
    sequences = raw.get("SequenceNumberRange", {})
    return ShardInfo(
        shard_id=str(raw["ShardId"]),
        parent_shard_id=raw.get("ParentShardId"),
        adjacent_parent_shard_id=raw.get("AdjacentParentShardId"),
        starting_hash_key=str(hashes.get("StartingHashKey", "0")),
        ending_hash_key=str(hashes.get("EndingHashKey", str(2**128 - 1))),
        starting_sequence_number=str(sequences.get("StartingSequenceNumber", "0")),
        ending_sequence_number=sequences.get("EndingSequenceNumber"),
    )


class KinesisShardDetector:
    def __init__(
        self,
        stream: str,
        *,
        aws_config: AwsConfig | None = None,
        boto3_session: boto3.Session | None = None,
        client: Any = None,
        clock: Clock = SYSTEM_CLOCK,
        page_size: int = 1000,
        max_attempts: int = 6,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
    ) -> None:
        self.stream = stream
        self._client = aws.client_or_new("kinesis", client, aws_config, boto3_session)
        self._clock = clock
        self._page_size = page_size
        self._max_attempts = max(1, max_attempts)
        # Between attempts: from backoff_base_s, doubling up to backoff_max_s, exact (one leader's listing).
        self._backoff = Backoff(base_s=backoff_base_s, max_s=backoff_max_s)
        self.calls = 0
        self._repeat_first = False  # set once an endpoint (moto) insists on the first call's parameters

    def _page(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(1, self._max_attempts + 1):
            self.calls += 1
            try:
                response: dict[str, Any] = self._client.list_shards(**kwargs)
                return response
            except botocore.exceptions.ClientError as exc:
                code = aws.error_code(exc)
                if code not in _RETRY_CODES or attempt == self._max_attempts:
                    aws.raise_translated(exc, operation="kinesis ListShards", resource=self.stream)
                delay = self._backoff.delay_s(attempt)
                log.info("ListShards on %s: %s, retrying in %.1f s", self.stream, code, delay)
                self._clock.sleep(delay)
            except botocore.exceptions.BotoCoreError as exc:
                aws.raise_translated(exc, operation="kinesis ListShards", resource=self.stream)
        raise ThrottledError(f"kinesis ListShards on {self.stream}: gave up")  # pragma: no cover - loop returns

    def shard_exists(self, shard_id: str) -> bool | None:
        """GetShardIterator(TRIM_HORIZON) on the shard: ResourceNotFoundException means it is gone (trimmed after
        its retention period, as KCL's lease cleanup checks); any other failure means "cannot tell"."""
        kwargs = {"StreamName": self.stream, "ShardId": shard_id, "ShardIteratorType": "TRIM_HORIZON"}
        for attempt in range(1, self._max_attempts + 1):
            self.calls += 1
            try:
                self._client.get_shard_iterator(**kwargs)
                return True
            except botocore.exceptions.ClientError as exc:
                code = aws.error_code(exc)
                if code == "ResourceNotFoundException":
                    return False
                if code not in _RETRY_CODES or attempt == self._max_attempts:
                    log.warning("cannot tell whether shard %s of %s exists: %s", shard_id, self.stream, code)
                    return None
                self._clock.sleep(self._backoff.delay_s(attempt))
            except botocore.exceptions.BotoCoreError as exc:
                log.warning("cannot tell whether shard %s of %s exists: %s", shard_id, self.stream, exc)
                return None
        return None  # pragma: no cover - the loop returns

    def list_shards(self) -> ShardListing:
        """Every shard of the stream, page by page; ``complete=False`` when a later page could not be read.

        An expired page token (``ExpiredNextTokenException``: a listing that took longer than the token's
        lifetime) restarts the listing from the first page, once.
        """
        for restart in range(2):
            try:
                return self._list_all()
            except _ExpiredToken as expired:
                if restart:
                    log.warning("ListShards on %s: page token expired twice; listing incomplete", self.stream)
                    return ShardListing(shards=expired.shards, complete=False, pages=expired.pages)
                log.info("ListShards on %s: page token expired; listing again from the first page", self.stream)
        raise AssertionError("unreachable")  # pragma: no cover

    def _list_all(self) -> ShardListing:
        shards: list[ShardInfo] = []
        first: dict[str, Any] = {"StreamName": self.stream, "MaxResults": self._page_size}
        kwargs = dict(first)
        pages = 0
        while True:
            try:
                response = self._follow_up(kwargs, first) if pages else self._page(kwargs)
            except DependencyError as exc:
                if not pages:
                    raise
                if aws.error_code(exc.__cause__ or exc) == "ExpiredNextTokenException":
                    raise _ExpiredToken(tuple(shards), pages) from exc
                log.warning("ListShards on %s stopped after %d pages (%s): listing incomplete", self.stream, pages, exc)
                return ShardListing(shards=tuple(shards), complete=False, pages=pages)
            pages += 1
            shards.extend(shard_from_response(raw) for raw in response.get("Shards", []))
            token = response.get("NextToken")
            if not token:
                return ShardListing(shards=tuple(shards), complete=True, pages=pages)
            kwargs = {**first, "NextToken": token} if self._repeat_first else {"NextToken": token}

    def _follow_up(self, kwargs: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
        """A follow-up page the AWS way (token only); moto's stateful tokens want the first call's parameters."""
        try:
            return self._page(kwargs)
        except DependencyError as exc:
            if "StreamName" in kwargs or aws.error_code(exc.__cause__ or exc) != "InvalidToken":
                raise
            log.debug("endpoint wants the first call's parameters with NextToken (moto); repeating them")
            self._repeat_first = True
            return self._page({**first, "NextToken": kwargs["NextToken"]})


class _ExpiredToken(Exception):
    def __init__(self, shards: tuple[ShardInfo, ...], pages: int) -> None:
        super().__init__("page token expired")
        self.shards = shards
        self.pages = pages
