"""Cascade judgement: is the cheaper model's answer good enough, or must it be escalated?

Signals, each reported with its value: mean and minimum chosen-token log-probability (from the engine, or an
upstream's logprobs), invalid JSON / schema violation when the request asked for JSON, an empty answer, a refusal,
and truncation (finish_reason "length"). Any failing signal escalates.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tokenomy.config import CascadeSettings

REFUSAL = re.compile(r"^\s*(i'?m sorry|i am sorry|sorry,|i can(?:'|no)t (?:help|assist|do)|i am unable|"
                     r"i'?m unable|as an ai\b|i cannot (?:help|assist|provide|comply))", re.I)


@dataclass
class Verdict:
    escalate: bool
    reasons: list[str] = field(default_factory=list)
    signals: dict[str, Any] = field(default_factory=dict)


def judge(text: str, logprobs: list[float], finish_reason: str | None, response_format: dict[str, Any] | None,
          settings: CascadeSettings, complete: bool = True) -> Verdict:
    """`complete` False: only a prefix of the answer is known (streams), so JSON and truncation wait."""
    v = Verdict(escalate=False)
    if logprobs:
        mean = sum(logprobs) / len(logprobs)
        low = min(logprobs)
        v.signals.update(mean_logprob=round(mean, 4), min_logprob=round(low, 4), judged_tokens=len(logprobs))
        if mean < settings.min_mean_logprob:
            v.reasons.append(f"mean logprob {mean:.2f} < {settings.min_mean_logprob}")
        if low < settings.min_token_logprob:
            v.reasons.append(f"min token logprob {low:.2f} < {settings.min_token_logprob}")
    if settings.escalate_on_empty and complete and not text.strip():
        v.reasons.append("empty answer")
    if settings.escalate_on_refusal and REFUSAL.search(text):
        v.reasons.append("refusal")
    if settings.escalate_on_truncated and complete and finish_reason == "length":
        v.reasons.append("truncated (max_tokens)")
    if settings.escalate_on_invalid_json and complete and response_format and \
            response_format.get("type") in ("json_object", "json_schema"):
        problem = json_problem(text, response_format)
        v.signals["json_valid"] = problem is None
        if problem:
            v.reasons.append(problem)
    v.escalate = bool(v.reasons)
    return v


def json_problem(text: str, response_format: dict[str, Any]) -> str | None:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg})"
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema:
            import jsonschema

            try:
                jsonschema.validate(doc, schema)
            except jsonschema.ValidationError as e:
                return f"schema violation ({e.message[:80]})"
            except jsonschema.SchemaError:
                return None
    elif not isinstance(doc, dict):
        return "JSON is not an object"
    return None
