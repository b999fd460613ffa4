"""Where the demo's narrative goes: the command line passes an implementation (worker_lib/cli/demo.py prints);
nothing under worker_lib/tools/ prints by itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol


class DemoOutput(Protocol):
    def say(self, line: str) -> None:
        """One line of the narrative (events, the closing report)."""

    def live(self) -> contextlib.AbstractContextManager[Callable[[Any], None]] | None:
        """A live view to update with rich renderables, or None for periodic plain lines (not a terminal)."""


class Silent:
    """No output at all (tests, embedding the demo in another program)."""

    def say(self, line: str) -> None:
        pass

    def live(self) -> None:
        return None
