"""A stream's ARN, for what must name the stream the way AWS does: the failure destination's reports carry it as
Lambda's do (``KinesisBatchInfo.streamArn``, each record's ``eventSourceARN``), and fan-out registers its consumer on
it."""

from __future__ import annotations

import logging
import threading
from typing import Any

from worker_lib.core import aws
from worker_lib.core.errors import DependencyError

log = logging.getLogger(__name__)


def stream_arn_of(kinesis: Any, stream: str) -> str:
    """The ARN of ``stream`` (DescribeStreamSummary); a :class:`DependencyError` if it cannot be had."""
    with aws.translated("kinesis DescribeStreamSummary", stream):
        return str(kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"])


class StreamArns:
    """Each stream's ARN, asked once and remembered; None (logged, asked again next time) while it cannot be had: a
    report without it still goes out rather than hold the shard."""

    def __init__(self, kinesis: Any) -> None:
        self._kinesis = kinesis
        self._lock = threading.Lock()
        self._known: dict[str, str] = {}

    def __call__(self, stream: str) -> str | None:
        with self._lock:
            known = self._known.get(stream)
        if known is not None:
            return known
        try:
            arn = stream_arn_of(self._kinesis, stream)
        except DependencyError as exc:
            log.warning("the ARN of stream %s is unknown (%s): the failure report names the stream only", stream, exc)
            return None
        with self._lock:
            self._known[stream] = arn
        return arn
