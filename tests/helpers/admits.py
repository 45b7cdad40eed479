"""A poll for tests that wait for a budget to admit again (a dead holder's lease ending)."""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.limits.budget import BudgetExceeded, Budgets


def admits(budgets: Budgets, *reservation: object) -> Callable[[], bool]:
    """For wait_until: whether `budgets.reserve(*reservation)` is admitted now (a refusal holds nothing)."""
    def admitted() -> bool:
        try:
            budgets.reserve(*reservation)  # type: ignore[arg-type]
        except BudgetExceeded:
            return False
        return True

    return admitted
