"""Sound rewrites of JSON Schema keywords the grammar compiler lacks, and a schema-aware walker.

Every rewrite here is exact or narrows the set of accepted documents, never widens it: a document the
rewritten schema accepts is valid under the original. That keeps constrained output 100% compliant while
compiling more real-world schemas:

- a custom ``format`` (not one the JSON Schema specs define, e.g. ``textarea``, ``password``) is an
  annotation validators must ignore; it is dropped. Standard formats llguidance lacks stay and are refused.
- ``not: {}`` is the schema ``false``; ``not: {type: T}`` becomes a ``type`` list without ``T``;
  ``not: {required: [a, b]}`` becomes "at least one of a, b absent" (``anyOf`` of ``properties: {x: false}``).
- draft-4 ``dependencies`` and draft-2019 ``dependentRequired`` / ``dependentSchemas``: ``trigger -> deps``
  becomes ``anyOf: [{trigger absent}, {trigger present and deps}]`` appended to ``allOf`` (exact).
- annotations beside a ``$ref`` (``description``, ``title``...) and a ``type`` the target already implies are
  dropped, because llguidance refuses recursive references that carry sibling keywords.
- a ``type`` beside ``anyOf`` / ``oneOf`` that every branch already implies is dropped (exact): llguidance
  intersects the type with each branch, which needs each ``$ref`` branch resolved, and refuses when one is
  recursive ("circular references with sibling keys").
- ``oneOf`` whose branches are provably pairwise disjoint becomes ``anyOf`` (exact; llguidance refuses a
  ``oneOf`` it cannot prove exclusive itself, and it does not resolve ``$ref`` branches to try).
- ``patternProperties`` with one pattern that matches every name (``.*``, ``^[a-z]*`` unanchored...) becomes
  ``additionalProperties`` when each listed property's schema lies inside the pattern's (proven by
  ``subsume.subsumes``): the key-by-key intersection llguidance would otherwise build changes nothing, and it
  fails on recursive references in the same way.

And one narrowing, ``close=True``: an object schema that lists ``properties`` but says nothing about other keys
gets ``additionalProperties: false``. Extra keys are valid but never needed, and a small model left free to add
them often invents keys until max_tokens. It is applied only where it cannot make the schema stricter than
intended elsewhere: not on members of ``allOf`` (or ``anyOf`` beside object keywords), not on ``$ref`` targets
used in such intersections, not anywhere under ``oneOf``/``not``/``if`` (where narrowing is not monotone), and
not where ``required`` names a key outside ``properties``.

And size bounds, ``max_length`` / ``max_items`` (off unless given): a default ``maxLength`` on free strings and
``maxItems`` on arrays that set none (``bound_sizes``), skipped under ``oneOf``/``not``/``if``.

And, with ``relaxed`` (a set the caller passes), the keywords llguidance cannot enforce are taken out of the
grammar instead of refusing the schema (``relax``): ``uniqueItems``, ``contains``, ``if``/``then``/``else``, a
``not`` the rewrites above could not express, a ``oneOf`` not proven exclusive (it becomes ``anyOf``), a
``format`` llguidance has no rule for (``regex``, ``uri-reference``...), a ``pattern`` with look-around or
back-references, ``propertyNames``, and ``min``/``maxProperties`` beside optional properties. This WIDENS the
grammar: the names of what was relaxed are added to ``relaxed``, and an answer made under such a grammar must be
validated against the original schema (pipeline/generate.py does, and repairs or refuses it). A
``minProperties`` met by requiring listed optional properties in order is a narrowing instead, and not reported.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

from tokenomy.structured.subsume import disjoint, resolve_ref, subsumes

# Keywords whose value is one subschema, a list of subschemas, or a name -> subschema map.
_ONE = ("additionalItems", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "contentSchema", "items")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies")
_SUBSCHEMA_KEYWORDS = frozenset(_ONE + _LIST + _MAP)

# Formats defined by the JSON Schema drafts (4 to 2020-12). Anything else is a custom annotation.
STANDARD_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uri-template", "uuid", "json-pointer",
    "relative-json-pointer", "regex",
})
# Keywords that never change which documents validate.
_ANNOTATIONS = ("description", "title", "$comment", "examples", "default", "$schema", "deprecated", "readOnly",
                "writeOnly")
_OBJECT_KEYWORDS = ("properties", "required", "additionalProperties", "patternProperties", "minProperties",
                    "maxProperties", "propertyNames", "unevaluatedProperties")
_NON_MONOTONE = ("oneOf", "not", "if", "then", "else")
_CLOSE_BLOCKERS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames",
                   "minProperties", "allOf", "anyOf", "oneOf", "$ref", "not", "if", "then", "else", "dependencies",
                   "dependentSchemas", "dependentRequired")
_ALL_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def subschemas(node: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """Yield ``(keyword, container, key)`` for each direct subschema of ``node``: ``container[key]`` is it.

    Values under ``const``, ``enum``, ``default``, ``examples`` and unknown keywords are data, never visited.
    """
    for kw, value in node.items():
        if kw not in _SUBSCHEMA_KEYWORDS:
            continue
        if isinstance(value, list):
            if kw in _LIST:
                for i, sub in enumerate(value):
                    if isinstance(sub, dict | bool):
                        yield kw, value, i
        elif kw in _MAP:
            if isinstance(value, dict):
                for name, sub in value.items():
                    if isinstance(sub, dict | bool):
                        yield kw, value, name
        elif isinstance(value, dict | bool):
            yield kw, node, kw


def walk(schema: Any, visit: Callable[[dict[str, Any]], None]) -> None:
    """Call ``visit(node)`` on every schema object reachable through subschema keywords, parents first.

    Iterative, so a deeply nested schema cannot exhaust the Python stack; ``visit`` may edit ``node`` in place
    (children are listed after it returns).
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        visit(node)
        stack.extend(container[key] for _, container, key in subschemas(node))


def normalize(schema: dict[str, Any], close: bool = False, max_length: int | None = None,
              max_items: int | None = None, relaxed: set[str] | None = None) -> dict[str, Any]:
    """Return a rewritten deep copy of ``schema`` (see the module docstring); the input is not modified.

    ``close`` closes plain objects (``close_objects``); ``max_length`` / ``max_items`` are default size bounds
    for free strings and arrays (``bound_sizes``). All three only narrow. With ``relaxed`` (a set), keywords
    the grammar cannot enforce are dropped and their names added to it (``relax``: a widening).
    """
    out = copy.deepcopy(schema)

    def rewrite(node: dict[str, Any]) -> None:
        _rewrite(node)
        _strip_ref_siblings(out, node)
        _drop_implied_type(out, node)
        _exclusive_one_of(out, node)

    walk(out, rewrite)
    # After the other rewrites, which make more pattern schemas provably contain their properties' schemas.
    walk(out, lambda node: _absorb_universal_pattern(out, node))
    if close:
        close_objects(out)
    if relaxed is not None:
        # After closing: a branch of an overlapping oneOf stays open as the client wrote it (closing one could
        # shut out the only answers that match exactly one branch), and the keywords that block closing (if,
        # not...) are dropped after that too. Before the size bounds, which then reach the branches: a bound
        # only takes answers away, and a small model needs it to end a list.
        walk(out, lambda node: _relax_one_of(node, relaxed))
    bound_sizes(out, max_length, max_items)
    cap_pattern_lengths(out)
    if relaxed is not None:
        walk(out, lambda node: relax(node, relaxed))
    return out


# A string's pattern is intersected with its length bounds in one lexer; with a long maxLength that blows up on
# an ordinary pattern (GitHub's "^$|(^(?:\\S+\\s+){0,99}\\S+$)" within 5000 characters: fails at 1000, works
# at 500), so a longer bound beside a pattern is lowered to this (a narrowing).
PATTERN_MAX_LENGTH = 500


def cap_pattern_lengths(schema: dict[str, Any]) -> None:
    """In place: ``maxLength`` above PATTERN_MAX_LENGTH beside a ``pattern`` becomes PATTERN_MAX_LENGTH (or
    ``minLength`` when that is longer); skipped under ``oneOf``/``not``/``if``, as ``bound_sizes``."""
    _, frozen = _marks(schema)

    def cap(node: dict[str, Any]) -> None:
        high, low = node.get("maxLength"), node.get("minLength", 0)
        if (id(node) not in frozen and isinstance(node.get("pattern"), str) and isinstance(high, int)
                and high > PATTERN_MAX_LENGTH and isinstance(low, int)):
            node["maxLength"] = max(PATTERN_MAX_LENGTH, low)

    walk(schema, cap)


# Standard formats llguidance 1.x has no rule for (it refuses the schema); jsonschema's checker still applies.
UNENFORCED_FORMATS = frozenset({"idn-email", "idn-hostname", "iri", "iri-reference", "json-pointer", "regex",
                                "relative-json-pointer", "uri-reference", "uri-template"})


def unenforced_pattern(pattern: Any) -> bool:
    """True if ``pattern`` uses a regex feature llguidance's regex engine (a DFA) cannot compile: look-around
    or a back-reference."""
    if not isinstance(pattern, str):
        return False
    # drop escaped backslashes first so that "\\1" (a literal backslash, then 1) is not a back-reference
    plain = pattern.replace("\\\\", "")
    return re.search(r"[(][?]<?[=!]|\\(?:[1-9]|k<)", plain) is not None


def _relax_one_of(node: dict[str, Any], relaxed: set[str]) -> None:
    """A ``oneOf`` still here (not proven exclusive) -> ``anyOf``: at least one branch instead of exactly one."""
    branches = node.get("oneOf")
    if not isinstance(branches, list):
        return
    del node["oneOf"]
    if len(branches) > 1:
        relaxed.add("oneOf")
    if "anyOf" in node:
        node.setdefault("allOf", []).append({"anyOf": branches})
    else:
        node["anyOf"] = branches


def relax(node: dict[str, Any], relaxed: set[str]) -> None:
    """Drop from ``node`` what the grammar cannot enforce (see the module docstring), naming it in ``relaxed``."""
    unique = node.pop("uniqueItems", None)
    if unique is True and not (isinstance(node.get("maxItems"), int) and node["maxItems"] <= 1):
        relaxed.add("uniqueItems")
    if "contains" in node:
        low = node.pop("minContains", 1)
        node.pop("maxContains", None)
        if node.pop("contains") is not True:
            relaxed.add("contains")
        if isinstance(low, int) and low > node.get("minItems", 0):
            node["minItems"] = low     # a narrowing: the items the dropped keyword needs at the least
    for kw in ("if", "then", "else"):
        if kw in node:
            del node[kw]
            relaxed.add("if")
    for kw in ("not", "propertyNames"):
        if kw in node:
            del node[kw]
            relaxed.add(kw)
    fmt = node.get("format")
    if fmt in UNENFORCED_FORMATS:
        del node["format"]
        relaxed.add("format")
    if unenforced_pattern(node.get("pattern")):
        del node["pattern"]
        relaxed.add("pattern")
    _relax_property_counts(node, relaxed)


def narrow_for_repair(schema: dict[str, Any]) -> dict[str, Any] | None:
    """A narrower copy of ``schema`` for a repair's second try, or None when there is none.

    The grammar leaves ``uniqueItems`` out (``relax``); a small model that repeated an item tends to repeat it
    again. An array that may hold a single item (``minItems`` at most 1) gets ``maxItems: 1``, which no
    repetition can break. A narrowing, except under ``oneOf``/``not``/``if``; the repaired answer is validated
    against the original schema either way.
    """
    out = copy.deepcopy(schema)
    changed = False

    def narrow(node: dict[str, Any]) -> None:
        nonlocal changed
        low, high = node.get("minItems", 0), node.get("maxItems")
        if (node.get("uniqueItems") is True and isinstance(low, int) and low <= 1
                and not (isinstance(high, int) and high <= 1)):
            node["maxItems"] = 1
            changed = True

    walk(out, narrow)
    return out if changed else None


def _relax_property_counts(node: dict[str, Any], relaxed: set[str]) -> None:
    """llguidance takes ``min``/``maxProperties`` only when every listed property is required."""
    props, required = node.get("properties"), node.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list) or set(props) <= set(required):
        return
    low, high = node.get("minProperties"), node.get("maxProperties")
    if isinstance(low, int):
        del node["minProperties"]
        missing = low - len(set(required))
        optional = [k for k in props if k not in required and props[k] is not False]
        if 0 < missing <= len(optional):
            node["required"] = [*required, *optional[:missing]]   # a narrowing: these keys make the count
        elif missing > 0:
            relaxed.add("minProperties")
    if isinstance(high, int):
        del node["maxProperties"]
        closed = node.get("additionalProperties") is False and "patternProperties" not in node
        if not (closed and len(props) <= high):
            relaxed.add("maxProperties")


def close_objects(schema: dict[str, Any]) -> None:
    """In place: ``additionalProperties: false`` on plain object schemas where that only narrows (see above)."""
    keep_node, keep_tree = _marks(schema)

    def close(node: dict[str, Any]) -> None:
        props = node.get("properties")
        required = node.get("required", [])
        if (id(node) in keep_node or id(node) in keep_tree or not isinstance(props, dict) or not props
                or any(k in node for k in _CLOSE_BLOCKERS) or not isinstance(required, list)
                or not set(required) <= set(props)):
            return
        node["additionalProperties"] = False

    walk(schema, close)


def bound_sizes(schema: dict[str, Any], max_length: int | None = None, max_items: int | None = None) -> None:
    """In place: a default ``maxLength`` on free strings and ``maxItems`` on arrays that have none.

    A string schema (``type`` string or a type list with string) with no ``maxLength``, ``pattern``,
    ``format``, ``enum`` or ``const`` gets ``maxLength = max(max_length, minLength)``; an array schema with no
    ``maxItems`` gets ``maxItems = max(max_items, minItems, minContains, len(prefixItems))``. Each only adds a
    constraint beside the existing ones, so it narrows. It is skipped under ``oneOf``/``not``/``if`` (and their
    ``$ref`` targets), where narrowing a branch can widen the whole. Why: a small model inside an unbounded
    string or list often repeats itself until max_tokens; a bound lets the grammar close the value for it.
    """
    if max_length is None and max_items is None:
        return
    _, frozen = _marks(schema)

    def types(node: dict[str, Any]) -> set[str]:
        t = node.get("type")
        return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()

    def bound(node: dict[str, Any]) -> None:
        if id(node) in frozen:
            return
        kinds = types(node)
        if (max_length is not None and "string" in kinds and "maxLength" not in node
                and not any(k in node for k in ("pattern", "format", "enum", "const"))):
            low = node.get("minLength", 0)
            node["maxLength"] = max(max_length, low if isinstance(low, int) else 0)
        if max_items is not None and "array" in kinds and "maxItems" not in node:
            lows = [node.get("minItems", 0), node.get("minContains", 0)]
            if isinstance(node.get("prefixItems"), list):
                lows.append(len(node["prefixItems"]))
            if isinstance(node.get("items"), list):  # draft-4..2019 tuple form
                lows.append(len(node["items"]))
            node["maxItems"] = max(max_items, *(x for x in lows if isinstance(x, int)))

    walk(schema, bound)


def _marks(schema: dict[str, Any]) -> tuple[set[int], set[int]]:
    """(ids of nodes intersected with other schemas for the same instance, ids of nodes under oneOf/not/if).

    Intersected: allOf members, anyOf members beside object keywords, $ref targets of refs with siblings, and
    (spreading) their own allOf/anyOf members and $ref targets. Frozen: whole subtrees under non-monotone
    keywords, plus everything they reference. Closing an object is unsound in both; a size bound only in the
    second.
    """
    keep_node: set[int] = set()
    keep_tree: set[int] = set()
    work: list[tuple[str, Any]] = []  # ("node" | "tree", subschema) to mark

    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("$ref"), str) and set(node) - {"$ref", *_ANNOTATIONS}:
            work.append(("node", resolve_ref(schema, node["$ref"])))
        objectish = any(k in node for k in _OBJECT_KEYWORDS)
        for kw, container, key in subschemas(node):
            child = container[key]
            if kw in _NON_MONOTONE:
                work.append(("tree", child))
            elif kw == "allOf" or (kw == "anyOf" and objectish):
                work.append(("node", child))
            stack.append(child)

    while work:
        kind, node = work.pop()
        if not isinstance(node, dict):
            continue
        if kind == "node":
            if id(node) in keep_node:
                continue
            keep_node.add(id(node))
            for kw, container, key in subschemas(node):
                if kw in ("allOf", "anyOf"):
                    work.append(("node", container[key]))
            if isinstance(node.get("$ref"), str):
                work.append(("node", resolve_ref(schema, node["$ref"])))
        elif id(node) not in keep_tree:
            def protect(n: dict[str, Any]) -> None:
                keep_tree.add(id(n))
                if isinstance(n.get("$ref"), str):
                    target = resolve_ref(schema, n["$ref"])
                    if isinstance(target, dict) and id(target) not in keep_tree:
                        work.append(("tree", target))
            walk(node, protect)
    return keep_node, keep_tree


def rebase_refs(schema: dict[str, Any], prefix: str) -> None:
    """Rewrite local ``$ref`` pointers (``#/...``) in place to ``#<prefix>/...``.

    Used when a schema is embedded under another root, e.g. tool parameters under ``/items/anyOf/0/...``.
    """
    def visit(node: dict[str, Any]) -> None:
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            node["$ref"] = "#" + prefix + ref[1:]

    walk(schema, visit)


def _rewrite(node: dict[str, Any]) -> None:
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in STANDARD_FORMATS:
        del node["format"]
    if "not" in node:
        _rewrite_not(node)
    for kw in ("dependencies", "dependentRequired", "dependentSchemas"):
        deps = node.get(kw)
        if isinstance(deps, dict) and _rewrite_dependencies(node, deps):
            del node[kw]


def _strip_ref_siblings(root: dict[str, Any], node: dict[str, Any]) -> None:
    ref = node.get("$ref")
    if not isinstance(ref, str) or len(node) == 1:
        return
    for kw in _ANNOTATIONS:
        node.pop(kw, None)
    if "type" in node:
        target = resolve_ref(root, ref)
        if isinstance(target, dict) and (target.get("type") == node["type"]
                                         or subsumes(root, {"type": node["type"]}, target)):
            del node["type"]


def _drop_implied_type(root: dict[str, Any], node: dict[str, Any]) -> None:
    """Drop ``type`` beside ``anyOf`` / ``oneOf`` when every branch lies inside it (the type adds nothing)."""
    if "type" not in node or "$ref" in node:
        return
    for kw in ("anyOf", "oneOf"):
        branches = node.get(kw)
        if isinstance(branches, list) and branches and all(
                subsumes(root, {"type": node["type"]}, b) for b in branches):
            del node["type"]
            return


def _exclusive_one_of(root: dict[str, Any], node: dict[str, Any]) -> None:
    """``oneOf`` whose branches are pairwise disjoint (``subsume.disjoint``) -> ``anyOf`` (exact).

    At most one branch can hold, so "exactly one" and "at least one" agree. llguidance refuses a ``oneOf`` it
    cannot prove exclusive itself, and it does not look through a ``$ref`` branch to do so.
    """
    branches = node.get("oneOf")
    if not isinstance(branches, list) or len(branches) > 16:  # pairwise proofs: keep the work bounded
        return
    if all(disjoint(root, a, b) for i, a in enumerate(branches) for b in branches[i + 1:]):
        del node["oneOf"]
        if "anyOf" in node:
            node.setdefault("allOf", []).append({"anyOf": branches})
        else:
            node["anyOf"] = branches


def universal_pattern(pattern: Any) -> bool:
    """True if ``pattern`` (unanchored search, as JSON Schema applies it) matches every string.

    It does when it matches the empty string at position 0 and uses no assertion that depends on what follows
    (end anchors, word boundaries, lookarounds): then it matches the empty prefix of any string.
    """
    if not isinstance(pattern, str) or any(x in pattern for x in ("$", "\\b", "\\B", "\\Z", "\\z", "(?")):
        return False
    try:
        return re.search(pattern, "") is not None
    except re.error:
        return False


def _absorb_universal_pattern(root: dict[str, Any], node: dict[str, Any]) -> None:
    """``patternProperties: {P: S}`` with P universal -> ``additionalProperties: S`` (see the module docstring).

    P matches every key, so any existing ``additionalProperties`` never applied; a listed property must satisfy
    its own schema and S, which is its own schema when that lies inside S, and S when S lies inside it.
    """
    patterns, props = node.get("patternProperties"), node.get("properties", {})
    if not isinstance(patterns, dict) or len(patterns) != 1 or not isinstance(props, dict):
        return
    (pattern, sub), = patterns.items()
    if not universal_pattern(pattern) or not isinstance(sub, dict | bool):
        return
    merged = {}
    for name, own in props.items():
        if subsumes(root, sub, own):
            merged[name] = own
        elif subsumes(root, own, sub):
            merged[name] = copy.deepcopy(sub)
        else:
            return
    props.update(merged)
    del node["patternProperties"]
    node["additionalProperties"] = sub


def _rewrite_not(node: dict[str, Any]) -> None:
    neg = node["not"]
    if neg is True or neg == {}:
        # "not anything": nothing is valid. Keep the node a dict so $ref pointers into it stay resolvable.
        del node["not"]
        node.setdefault("allOf", []).append(False)
        return
    if not isinstance(neg, dict):
        return
    keys = set(neg) - {"description", "title", "$comment"}
    if keys == {"type"}:
        banned = {neg["type"]} if isinstance(neg["type"], str) else set(neg["type"])
        if "number" in banned:
            banned.add("integer")  # every integer is a number
        current = node.get("type", list(_ALL_TYPES))
        current = [current] if isinstance(current, str) else list(current)
        kept = [t for t in current if t not in banned]
        if "integer" in banned and "number" in kept:
            return  # "a number that is not an integer" has no type-only form; leave it to the compiler
        del node["not"]
        if kept:
            node["type"] = kept
        else:
            node.setdefault("allOf", []).append(False)
    elif keys == {"required"} and isinstance(neg["required"], list) and neg["required"]:
        del node["not"]
        absent = [{"properties": {name: False}} for name in neg["required"]]
        node.setdefault("allOf", []).append({"anyOf": absent})


def _rewrite_dependencies(node: dict[str, Any], deps: dict[str, Any]) -> bool:
    clauses = []
    for trigger, dep in deps.items():
        absent: dict[str, Any] = {"properties": {trigger: False}}
        if isinstance(dep, list) and all(isinstance(d, str) for d in dep):
            present: dict[str, Any] = {"required": [trigger, *dep]}
        elif isinstance(dep, dict | bool):
            present = {"required": [trigger], "allOf": [dep]}
        else:
            return False
        clauses.append({"anyOf": [absent, present]})
    node.setdefault("allOf", []).extend(clauses)
    return True
