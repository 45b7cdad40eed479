"""Rule-based routing: the first rule whose conditions all hold picks the model."""

from __future__ import annotations

import re
from typing import Any

from tokenomy.config import RuleSpec, RuleWhen


def rule_matches(when: RuleWhen, *, prompt_tokens: int | None, text: str, has_tools: bool,
                 has_response_format: bool, tenant: str, metadata: dict[str, str]) -> bool:
    if when.min_prompt_tokens is not None and (prompt_tokens or 0) < when.min_prompt_tokens:
        return False
    if when.max_prompt_tokens is not None and (prompt_tokens or 0) > when.max_prompt_tokens:
        return False
    if when.regex is not None and not re.search(when.regex, text):
        return False
    if when.keywords is not None and not any(k.lower() in text.lower() for k in when.keywords):
        return False
    if when.has_tools is not None and when.has_tools != has_tools:
        return False
    if when.has_response_format is not None and when.has_response_format != has_response_format:
        return False
    if when.tenant is not None and when.tenant != tenant:
        return False
    return all(metadata.get(k) == v for k, v in (when.metadata or {}).items())


def first_match(rules: list[RuleSpec], **facts: Any) -> tuple[str, int] | None:
    """(model, rule index) of the first matching rule, or None."""
    for i, rule in enumerate(rules):
        if rule_matches(rule.when, **facts):
            return rule.model, i
    return None
