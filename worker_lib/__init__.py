"""shardlease: KCL 3.x-compatible lease coordination for Amazon Kinesis consumers, in pure Python.

Importing this package creates no AWS clients and starts no threads.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
