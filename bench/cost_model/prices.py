"""Prices (us-east-1, on-demand; the same as docs/deploy.md §5) and the scales the measured rates are extrapolated to.

Kept apart from the measuring so that a price change or a new scale never touches how calls are counted.
"""

from __future__ import annotations

PRICE_PER_WRU = 0.625 / 1e6
PRICE_PER_RRU = 0.125 / 1e6
PRICE_PER_GB_S = 0.0000133334  # Lambda arm64
PRICE_PER_REQUEST = 0.20 / 1e6  # Lambda requests
LAMBDA_GB = 0.25  # 256 MB
MINUTES_PER_MONTH = 43_200  # 30 days

SCALES: tuple[tuple[int, int], ...] = tuple((n, w) for n in (100, 1_000, 10_000) for w in (20, 100))
HEADLINE = (1_000, 20)  # the last line's scale
TARGET_RATIO = {(1_000, 20): 10.0, (10_000, 100): 50.0}  # lease ÷ worker writes per minute, at least
DETAIL_SCALES = ((1_000, 20), (10_000, 100))  # scales printed call by call (all scales are in the totals and JSON)
