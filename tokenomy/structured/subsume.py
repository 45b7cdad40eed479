"""Schema inclusion, proven conservatively: ``subsumes(root, big, small)`` is True only if every instance valid
under ``small`` is valid under ``big``.

normalize.py uses it to drop intersections that change nothing (``small`` inside ``big`` means ``small`` and
``big`` together accept exactly what ``small`` accepts). llguidance has to resolve a ``$ref`` to intersect it and
cannot when the reference is recursive ("circular references with sibling keys"), so each intersection removed
this way can turn a refused schema into a compiled one with the same meaning.

The proof rules, for ``big`` ⊇ ``small`` (both may be ``$ref`` pointers into ``root``, resolved as they come):

- ``big`` is ``true`` / ``{}`` (annotations aside), or ``small`` is ``false``, or both are the same ``$ref``,
  or they are equal once annotations are dropped; a ``small`` with a ``$ref`` is replaced by its target (its
  siblings are ignored before draft 2019 and only narrow it after);
- ``small`` is an ``enum`` / ``const``: every listed value validates under ``big`` (jsonschema, formats checked);
- ``big`` with ``anyOf`` / ``allOf`` beside other keywords: both parts contain ``small``;
- ``big`` is a bare ``anyOf``: some branch contains ``small``; ``small`` is a bare ``anyOf`` / ``oneOf``: every
  branch is inside ``big``; ``small`` has an ``allOf``: one member is inside ``big``; ``big`` is a bare
  ``allOf``: every member contains ``small``;
- otherwise ``big`` may use only ``type``, ``properties``, ``required``, ``additionalProperties`` and ``items``
  (any other keyword must appear in ``small`` with the same value), and: ``small``'s types are among ``big``'s;
  ``big.required`` ⊆ ``small.required``; each of ``big``'s properties contains what ``small`` allows for that key;
  keys ``small`` allows beyond ``big.properties`` fit ``big.additionalProperties``; ``big.items`` contains
  ``small.items``.

Recursive schemas: a pair (big, small) met again below an object or array it is already being proven for is
taken as proven. That is induction on the depth of the document (a finite JSON value), so it is sound. A step
budget bounds the work; running out means "not proven".
"""

from __future__ import annotations

from typing import Any

import jsonschema

ANNOTATIONS = frozenset({"description", "title", "$comment", "examples", "default", "$schema", "deprecated",
                         "readOnly", "writeOnly", "$id", "id"})
_STRUCTURAL = frozenset({"type", "properties", "required", "additionalProperties", "items"})
_ONE = frozenset({"additionalItems", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties", "items"})
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_MAP = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies"})
_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
MAX_STEPS = 4000


def subsumes(root: dict[str, Any], big: Any, small: Any, max_steps: int = MAX_STEPS) -> bool:
    """True only if every instance valid under ``small`` is valid under ``big`` (local ``$ref`` resolved in
    ``root``). False means "not proven", never "not included"."""
    return _Prover(root, max_steps).check(big, small)


def disjoint(root: dict[str, Any], a: Any, b: Any, max_steps: int = MAX_STEPS) -> bool:
    """True only if no instance is valid under both ``a`` and ``b`` (local ``$ref`` resolved in ``root``).

    Rules: one side is ``false``; their types do not meet; an ``enum`` / ``const`` side whose every value is
    invalid under the other (jsonschema, formats not checked, so a value is ruled out only by what every
    validator checks); a ``$ref`` side's target, or an ``allOf`` member, disjoint from the other side (the side
    lies inside it); every branch of an ``anyOf`` / ``oneOf`` disjoint from the other side; two object
    schemas with a key one of them requires whose allowed values (``properties``, else
    ``additionalProperties``) are disjoint. False means "not proven".
    """
    return _Prover(root, max_steps).apart(a, b)


def strip(schema: Any) -> Any:
    """``schema`` without annotation keywords at any depth (for equality up to annotations). Property names
    and data (``enum``, ``const``, unknown keywords) are kept as they are."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for kw, value in schema.items():
        if kw in ANNOTATIONS:
            continue
        if kw in _MAP and isinstance(value, dict):
            out[kw] = {name: strip(sub) for name, sub in value.items()}
        elif kw in _LIST and isinstance(value, list):
            out[kw] = [strip(sub) for sub in value]
        elif kw in _ONE:
            out[kw] = strip(value)
        else:
            out[kw] = value
    return out


class _Prover:
    def __init__(self, root: dict[str, Any], max_steps: int) -> None:
        self.root = root
        self.steps = max_steps
        self.assumed: set[tuple[int, int]] = set()  # pairs being proven at an enclosing object/array
        self._validator: Any = None

    def check(self, big: Any, small: Any) -> bool:
        self.steps -= 1
        if self.steps < 0:
            return False
        big, small = self._core(big), self._core(small)
        if big is None or small is None:
            return False
        if big is True or big == {} or small is False:
            return True
        if big is False or small is True:
            return small is False
        if (id(big), id(small)) in self.assumed:
            return True
        if "$ref" in big and big.get("$ref") == small.get("$ref") and len(big) == len(small) == 1:
            return True
        if "$ref" in small:
            # Siblings of $ref are ignored before draft 2019 and narrow it after: the target bounds small either way.
            return self.check(big, self._resolve(small["$ref"]))
        if "$ref" in big and len(big) == 1:
            return self.check(self._resolve(big["$ref"]), small)
        if strip(big) == strip(small):
            return True
        if "enum" in small or "const" in small:
            values = small["enum"] if "enum" in small else [small["const"]]
            if isinstance(values, list) and all(self._valid(v, big) is True for v in values):
                return True
        for kw in ("anyOf", "allOf"):  # big is the conjunction of the applicator and its other keywords
            if kw in big and len(big) > 1:
                rest = {k: v for k, v in big.items() if k != kw}
                return self.check({kw: big[kw]}, small) and self.check(rest, small)
        if set(big) == {"anyOf"} and isinstance(big["anyOf"], list):
            return any(self.check(b, small) for b in big["anyOf"])
        for kw in ("anyOf", "oneOf"):  # every instance of small matches some branch
            if set(small) == {kw} and isinstance(small[kw], list):
                return all(self.check(big, s) for s in small[kw])
        if isinstance(small.get("allOf"), list) and any(self.check(big, s) for s in small["allOf"]):
            return True
        if set(big) == {"allOf"} and isinstance(big["allOf"], list):
            return all(self.check(b, small) for b in big["allOf"])
        return self._structural(big, small)

    def apart(self, a: Any, b: Any) -> bool:
        self.steps -= 1
        if self.steps < 0:
            return False
        a, b = self._core(a), self._core(b)
        if a is None or b is None:
            return False
        if a is False or b is False:
            return True
        if a is True or b is True:
            return False
        # A $ref side is bounded by its target (siblings are ignored before draft 2019, narrow it after).
        if "$ref" in a:
            return self.apart(self._resolve(a["$ref"]), b)
        if "$ref" in b:
            return self.apart(a, self._resolve(b["$ref"]))
        for x, y in ((a, b), (b, a)):
            if isinstance(x.get("allOf"), list) and any(self.apart(m, y) for m in x["allOf"]):
                return True
            for kw in ("anyOf", "oneOf"):  # x lies inside the union of its branches
                if isinstance(x.get(kw), list) and all(self.apart(m, y) for m in x[kw]):
                    return True
            if "enum" in x or "const" in x:
                values = x["enum"] if "enum" in x else [x["const"]]
                if isinstance(values, list) and all(self._valid(v, y, formats=False) is False for v in values):
                    return True
        ta, tb = _types(a), _types(b)
        common = {t for t in ta if t in tb or (t == "integer" and "number" in tb)}
        common |= {t for t in tb if t == "integer" and "number" in ta}
        if not common:
            return True
        if common != {"object"}:
            return False
        for name in _required(a) | _required(b):
            if self.apart(_property(a, name), _property(b, name)):
                return True
        return False

    def _structural(self, big: dict[str, Any], small: dict[str, Any]) -> bool:
        for kw, value in big.items():
            # Any other keyword must constrain small identically; unevaluated* depend on their siblings.
            if kw not in _STRUCTURAL and (small.get(kw, object()) != value or kw.startswith("unevaluated")):
                return False
        big_types, small_types = _types(big), _types(small)
        if not all(t in big_types or (t == "integer" and "number" in big_types) for t in small_types):
            return False
        key = (id(big), id(small))
        self.assumed.add(key)
        try:
            if "object" in small_types and not self._object(big, small):
                return False
            if "array" in small_types and "items" in big and not (
                    "items" in small and self.check(big["items"], small["items"])):
                return False
        finally:
            self.assumed.discard(key)
        return True

    def _object(self, big: dict[str, Any], small: dict[str, Any]) -> bool:
        req_big, req_small = big.get("required", []), small.get("required", [])
        if not (isinstance(req_big, list) and isinstance(req_small, list) and set(req_big) <= set(req_small)):
            return False
        props_big = big.get("properties", {})
        props_small = small.get("properties", {})
        if not isinstance(props_big, dict) or not isinstance(props_small, dict):
            return False
        extra_small = small.get("additionalProperties", True)
        if "patternProperties" in small:
            extra_small = True  # what a patterned key may hold is not read here; treat extra keys as free
        for name, sub in props_big.items():
            if not self.check(sub, props_small.get(name, extra_small)):
                return False
        extra_big = big.get("additionalProperties", True)
        for name, sub in props_small.items():
            if name not in props_big and not self.check(extra_big, sub):
                return False
        return self.check(extra_big, extra_small)

    def _core(self, schema: Any) -> Any:
        """The schema without annotations (a dict or a bool), or None when it is neither."""
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            return None
        if not any(k in ANNOTATIONS for k in schema):
            return schema
        return {k: v for k, v in schema.items() if k not in ANNOTATIONS}

    def _resolve(self, ref: Any) -> Any:
        return resolve_ref(self.root, ref)

    def _valid(self, value: Any, schema: Any, formats: bool = True) -> bool | None:
        """Whether ``value`` validates under ``schema``; None when jsonschema cannot tell (bad ref...)."""
        try:
            if self._validator is None:
                cls = jsonschema.validators.validator_for(self.root)
                self._validator = cls(self.root)
                self._checked = cls(self.root, format_checker=cls.FORMAT_CHECKER)
            return (self._checked if formats else self._validator).evolve(schema=schema).is_valid(value)
        except Exception:  # an unresolvable ref or malformed keyword
            return None


def _types(schema: dict[str, Any]) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if isinstance(values, list):
            return {_type_of(v) for v in values}
    return set(_ALL_TYPES)


def _required(schema: dict[str, Any]) -> set[str]:
    req = schema.get("required", [])
    return {r for r in req if isinstance(r, str)} if isinstance(req, list) else set()


def _property(schema: dict[str, Any], name: str) -> Any:
    """An upper bound of what ``schema`` allows under key ``name`` (True when not known)."""
    props = schema.get("properties", {})
    if isinstance(props, dict) and name in props:
        return props[name]
    if "patternProperties" in schema:
        return True
    return schema.get("additionalProperties", True)


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def resolve_ref(root: Any, ref: Any) -> Any:
    """The subschema a local JSON-pointer ``$ref`` names, or None when it is not local or not found."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node: Any = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
