"""Waiting for what another thread or process does: poll a condition until it holds or a deadline passes.

A test never sleeps a fixed time and hopes the other side got there: on a busy machine it has not, on a fast one
the test wastes the time. The deadline only bounds a failing test, so it is generous; a passing one returns as
soon as the condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 60.0
INTERVAL_S = 0.01


def _check(deadline: float, timeout: float, condition: Callable[[], object], what: str | None) -> None:
    if time.monotonic() > deadline:
        name = what or getattr(condition, "__name__", repr(condition))
        raise AssertionError(f"still waiting after {timeout:g} s for {name}")


def wait_until(condition: Callable[[], T], timeout: float = TIMEOUT_S, interval: float = INTERVAL_S,
               what: str | None = None) -> T:
    """The first truthy value `condition()` returns, calling it every `interval` seconds; AssertionError naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        _check(deadline, timeout, condition, what)
        time.sleep(interval)
    return value


async def wait_until_async(condition: Callable[[], T | Awaitable[T]], timeout: float = TIMEOUT_S,
                           interval: float = INTERVAL_S, what: str | None = None) -> T:
    """wait_until in a coroutine: the event loop runs other tasks between the calls. `condition` may be a coroutine
    function (a check that itself awaits, such as a request); its result is awaited each time."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        _check(deadline, timeout, condition, what)
        await asyncio.sleep(interval)
