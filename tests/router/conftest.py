"""Shared fixtures (tests/helpers/routing_fixtures.py): slices of RouteLLM's dev file and a classifier trained on
one."""

from tests.helpers.routing_fixtures import dev_rows, test_file, train_file, trained  # noqa: F401
