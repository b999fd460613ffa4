"""``<app>-WorkerMetricStats`` items <-> :class:`~worker_lib.core.models.WorkerMetricStats`, as pure functions.

The item format is KCL 3.x's (docs/kcl-compatibility.md): ``wid`` (S), ``lut`` (N, epoch seconds), ``sts`` (M:
metric → L of N, newest last, −1 = a window without samples), ``opr`` (M: metric → L of N, first = maximum
utilisation), and, from KCL 3.5 on, ``entityType`` (S). Items use DynamoDB's low-level attribute-value shapes
(``{"S": ...}``), as the stores' clients send and receive them.

Reading is strict about shapes and lenient about extras: an attribute we do not know is ignored, a known
attribute of the wrong shape makes the item corrupt (:class:`~worker_lib.core.errors.CorruptItemError`, whose message
names the key and the attribute, never a value). Writing refuses values DynamoDB cannot store (NaN, infinities).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from worker_lib.core.errors import CorruptItemError
from worker_lib.core.models import LaneStats, WorkerHeartbeat, WorkerMetricStats, WorkerState
from worker_lib.tables.schema import WORKER_METRICS_ENTITY_TYPE, WorkerMetricsAttr

A = WorkerMetricsAttr
Item = dict[str, Any]

__all__ = ["from_item", "is_foreign", "key_of", "number", "to_item"]


def number(value: float) -> dict[str, str]:
    """A DynamoDB ``N`` for a finite number, written as KCL writes it (``40.5``, ``55``, ``-1``)."""
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"worker metrics cannot store the non-finite number {value!r}")
    if as_float.is_integer():
        return {"N": str(int(as_float))}
    return {"N": repr(as_float)}


def _metric_map(values: Mapping[str, tuple[float, ...]]) -> dict[str, Any]:
    return {"M": {str(name): {"L": [number(v) for v in series]} for name, series in values.items()}}


def to_item(stats: WorkerMetricStats) -> Item:
    """The item a worker writes (unconditionally) for ``stats``."""
    if not stats.worker_id:
        raise ValueError("a worker-metrics item needs a worker id")
    item: Item = {
        A.WORKER_ID: {"S": stats.worker_id},
        A.LAST_UPDATE: number(int(stats.last_update_epoch_s)),
        A.STATS: _metric_map(stats.stats),
        A.OPERATING_RANGE: _metric_map(stats.operating_range),
    }
    if stats.entity_type is not None:
        item[A.ENTITY_TYPE] = {"S": stats.entity_type}
    if stats.capacity is not None:
        item[A.CAPACITY] = number(stats.capacity)
    if stats.lag_ms:
        item[A.LAG] = {"M": {key: number(int(ms)) for key, ms in stats.lag_ms.items()}}
    if stats.lanes:
        item[A.LANES] = {
            "M": {
                key: {
                    "M": {
                        A.LANE_IN_FLIGHT: number(int(lane.in_flight)),
                        A.LANE_WATERMARK_LAG: number(int(lane.watermark_lag_ms)),
                    }
                }
                for key, lane in stats.lanes.items()
            }
        }
    return item


def key_of(item: Mapping[str, Any]) -> str:
    """The item's ``wid`` for log lines ("?" when it has none)."""
    raw = item.get(A.WORKER_ID)
    if isinstance(raw, Mapping) and isinstance(raw.get("S"), str):
        return str(raw["S"])
    return "?"


def _entity_type(item: Mapping[str, Any]) -> str | None:
    raw = item.get(A.ENTITY_TYPE)
    if isinstance(raw, Mapping) and isinstance(raw.get("S"), str):
        return str(raw["S"])
    return None


def is_foreign(item: Mapping[str, Any]) -> bool:
    """True for an item of another entity (KCL 3.5 single-table mode): readers skip it silently."""
    entity = _entity_type(item)
    return entity is not None and entity != WORKER_METRICS_ENTITY_TYPE


def _finite(raw: Any) -> float:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("N"), str):
        raise ValueError("not a number")
    value = float(raw["N"])
    if not math.isfinite(value):
        raise ValueError("not finite")
    return value


def _read_map(item: Mapping[str, Any], attr: str, key: str) -> dict[str, tuple[float, ...]]:
    raw = item.get(attr)
    if raw is None or (isinstance(raw, Mapping) and raw.get("NULL") is True):
        return {}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("M"), Mapping):
        raise CorruptItemError(key, f"{attr} is not a map")
    out: dict[str, tuple[float, ...]] = {}
    for name, series in raw["M"].items():
        if not isinstance(series, Mapping) or not isinstance(series.get("L"), list):
            raise CorruptItemError(key, f"{attr}.{name} is not a list")
        try:
            out[str(name)] = tuple(_finite(v) for v in series["L"])
        except ValueError as exc:
            raise CorruptItemError(key, f"{attr}.{name} holds a non-number") from exc
    return out


def from_item(item: Mapping[str, Any]) -> WorkerMetricStats:
    """The model for one item; :class:`CorruptItemError` if it is not a worker-metrics item.

    Callers skip :func:`is_foreign` items first (this function reads the ``entityType`` through unchanged).
    """
    key = key_of(item)
    if key == "?" or not key:
        raise CorruptItemError(key, f"no {A.WORKER_ID}")
    try:
        lut = _finite(item.get(A.LAST_UPDATE))
    except ValueError as exc:
        raise CorruptItemError(key, f"{A.LAST_UPDATE} missing or not a number") from exc
    return WorkerMetricStats(
        worker_id=key,
        last_update_epoch_s=int(lut),
        stats=_read_map(item, A.STATS, key),
        operating_range=_read_map(item, A.OPERATING_RANGE, key),
        entity_type=_entity_type(item),
        heartbeat=heartbeat_of(item),
        assignment_version=_whole(item.get(A.ASSIGNMENT_VERSION)) or 0,
        assigned_keys=_strings(item.get(A.ASSIGNED_KEYS)),
        handoff_requests=_strings(item.get(A.HANDOFF_REQUESTS)),
        capacity=_capacity(item.get(A.CAPACITY)),
        lag_ms=_lags(item.get(A.LAG)),
        lanes=_lanes(item.get(A.LANES)),
    )


def _lags(raw: Any) -> dict[str, int]:
    """Lenient: a lag that is not a number is left out (it only feeds ``shardlease status``)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("M"), Mapping):
        return {}
    out: dict[str, int] = {}
    for key, value in raw["M"].items():
        try:
            out[str(key)] = int(_finite(value))
        except ValueError:
            continue
    return out


def _lanes(raw: Any) -> dict[str, LaneStats]:
    """Lenient, as :func:`_lags`: an entry that is not a map of two numbers ≥ 0 is left out."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("M"), Mapping):
        return {}
    out: dict[str, LaneStats] = {}
    for key, value in raw["M"].items():
        fields = value.get("M") if isinstance(value, Mapping) else None
        if not isinstance(fields, Mapping):
            continue
        try:
            in_flight = _finite(fields.get(A.LANE_IN_FLIGHT))
            lag_ms = _finite(fields.get(A.LANE_WATERMARK_LAG))
        except ValueError:
            continue
        if in_flight >= 0 and lag_ms >= 0:
            out[str(key)] = LaneStats(in_flight=int(in_flight), watermark_lag_ms=int(lag_ms))
    return out


def _capacity(raw: Any) -> float | None:
    """``cap`` when it is a positive finite number; anything else is treated as not reported (the fleet is then
    evened by plain lease count, as before the attribute existed)."""
    try:
        value = _finite(raw)
    except ValueError:
        return None
    return value if value > 0 else None


# --- our liveness attributes (docs/failover.md). Read leniently: a malformed value is treated as absent, so that a
# foreign writer can at worst make a worker look like one that does not heartbeat (judged by its leases, as KCL).


def _whole(raw: Any) -> int | None:
    try:
        value = _finite(raw)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def _strings(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, Mapping):
        return ()
    if isinstance(raw.get("SS"), list):
        return tuple(sorted(str(v) for v in raw["SS"]))
    if isinstance(raw.get("L"), list):
        return tuple(str(v["S"]) for v in raw["L"] if isinstance(v, Mapping) and isinstance(v.get("S"), str))
    return ()


def heartbeat_of(item: Mapping[str, Any]) -> WorkerHeartbeat | None:
    """The heartbeat attributes of a worker-metrics item, or ``None`` if the worker does not heartbeat."""
    counter = _whole(item.get(A.HEARTBEAT_COUNTER))
    wall_ms = _whole(item.get(A.HEARTBEAT_WALL_MS))
    interval_ms = _whole(item.get(A.HEARTBEAT_INTERVAL_MS))
    if counter is None or wall_ms is None or interval_ms is None or interval_ms <= 0:
        return None
    raw_state = item.get(A.WORKER_STATE)
    state = WorkerState.ACTIVE
    if isinstance(raw_state, Mapping) and isinstance(raw_state.get("S"), str):
        try:
            state = WorkerState(raw_state["S"])
        except ValueError:
            state = WorkerState.ACTIVE
    return WorkerHeartbeat(
        counter=counter,
        wall_ms=wall_ms,
        interval_ms=interval_ms,
        state=state,
        events=_whole(item.get(A.EVENT_COUNTER)) or 0,
        liveness=_string(item.get(A.LIVENESS_MODE)),
        session=_string(item.get(A.HEARTBEAT_SESSION)),
        gone_counter=_whole(item.get(A.HEARTBEAT_GONE)),
    )


def _string(raw: Any) -> str | None:
    return str(raw["S"]) if isinstance(raw, Mapping) and isinstance(raw.get("S"), str) else None
