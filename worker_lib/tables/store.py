"""What every store of a shardlease table has in common (:class:`TableStore`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.tables.schema import ItemPlace, TableLayout

if TYPE_CHECKING:
    import boto3


class StoreOptions(TypedDict, total=False):
    """:class:`TableStore`'s keyword arguments, for a subclass that takes more and passes these on."""

    aws_config: AwsConfig | None
    boto3_session: boto3.Session | None
    client: Any
    clock: Clock
    layout: TableLayout | None


class TableStore:
    """The base of the stores of one kind of item: where the items live (their table and key attribute, which KCL
    3.5's single-table mode moves into the lease table: :meth:`place`), a DynamoDB client — ``client`` if given, else
    one made from ``aws_config`` and ``boto3_session`` as boto3 would — and the injected clock."""

    def __init__(
        self,
        app: str,
        *,
        aws_config: AwsConfig | None = None,
        boto3_session: boto3.Session | None = None,
        client: Any = None,
        clock: Clock = SYSTEM_CLOCK,
        layout: TableLayout | None = None,
    ) -> None:
        self._place = self.place(app, layout or TableLayout.from_env())
        self.table_name = self._place.table_name
        self._client = aws.client_or_new("dynamodb", client, aws_config, boto3_session)
        self._clock = clock

    @classmethod
    def place(cls, app: str, layout: TableLayout) -> ItemPlace:
        """Where this store's items live in ``layout``."""
        raise NotImplementedError
