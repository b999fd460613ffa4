"""Fault injection at the botocore layer (event hooks), for tests against real emulators.

``lose_replies(client, "UpdateItem", times=1)`` makes botocore treat the next successful reply as lost: the
request *was applied* by the emulator, and botocore sends it again — exactly what happens when a reply is
dropped on the network. The retry then fails its condition, which is what the stores must recognise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def lose_replies(client: Any, operation: str, *, times: int = 1) -> Iterator[list[int]]:
    """Drop the reply of the next ``times`` successful ``operation`` calls (each is re-sent by botocore)."""
    lost: list[int] = []
    service = client.meta.service_model.service_name
    event = f"needs-retry.{service}.{operation}"

    def handler(attempts: int, response: Any, caught_exception: Any, **_: Any) -> float | None:
        status = response[0].status_code if response else None
        if len(lost) < times and caught_exception is None and status == 200:
            lost.append(attempts)
            return 0.0  # "retry after 0 s": the applied request is sent again
        return None

    client.meta.events.register_first(event, handler, unique_id=f"lose-replies-{id(lost)}")
    try:
        yield lost
    finally:
        client.meta.events.unregister(event, unique_id=f"lose-replies-{id(lost)}")
