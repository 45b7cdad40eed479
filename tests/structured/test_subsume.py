"""Inclusion and disjointness proofs: every True is checked against jsonschema on instances."""

import jsonschema

from tokenomy.structured.subsume import disjoint, strip, subsumes

ROOT = {
    "definitions": {
        "redirect": {"type": "object", "additionalProperties": False, "required": ["type", "url"],
                     "properties": {"type": {"type": "string", "enum": ["redirect"]}, "url": {"type": "string"}}},
        "content": {"type": "object", "required": ["type"], "additionalProperties": {},
                    "properties": {"type": {"type": "string"},
                                   "related": {"type": "array", "items": {"$ref": "#/definitions/content"}}}},
        "reference": {"type": "object", "additionalProperties": False, "required": ["type", "id"],
                      "properties": {"type": {"enum": ["reference"]}, "id": {"type": "string"}}},
    }
}
INSTANCES = [{"type": "redirect", "url": "u"}, {"type": "reference", "id": "x"}, {"type": "story"},
             {"type": "story", "related": [{"type": "a"}]}, {"type": "story", "related": [{"kind": 1}]}, {}, "s", 3]


def _valid(schema, inst) -> bool:
    return jsonschema.Draft7Validator(dict(ROOT, **schema)).is_valid(inst)


def _ref(name: str) -> dict:
    return {"$ref": f"#/definitions/{name}"}


def test_inclusion_holds_on_instances_when_proven():
    cases = [(_ref("content"), _ref("redirect")), ({"anyOf": [_ref("content"), _ref("reference")]}, _ref("redirect")),
             ({"type": "object"}, _ref("reference")), ({"type": "string"}, {"enum": ["a", "b"]}),
             ({"type": "number"}, {"type": "integer"}), (_ref("content"), _ref("content"))]
    for big, small in cases:
        assert subsumes(ROOT, big, small), (big, small)
        for inst in INSTANCES:
            assert not _valid(small, inst) or _valid(big, inst), (big, small, inst)


def test_inclusion_not_claimed_when_false():
    assert not subsumes(ROOT, _ref("reference"), _ref("redirect"))  # type enums differ
    assert not subsumes(ROOT, _ref("redirect"), _ref("content"))  # content is open, redirect closed
    assert not subsumes(ROOT, {"type": "integer"}, {"type": "number"})
    assert not subsumes(ROOT, {"type": "string", "maxLength": 3}, {"type": "string"})
    # a property named like an annotation is a property, not an annotation
    a = {"type": "object", "properties": {"title": {"type": "integer"}}}
    b = {"type": "object", "properties": {"title": {"type": "string"}}}
    assert strip(a) != strip(b) and not subsumes(ROOT, a, b)


def test_recursive_inclusion_is_proven_through_the_recursion():
    root = {"definitions": {"t": {"type": "object", "properties": {"kids": {"type": "array",
                                                                             "items": {"$ref": "#/definitions/t"}}},
                                  "required": ["kids"]}}}
    loose = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/definitions/t"}}}}
    assert subsumes(root, loose, {"$ref": "#/definitions/t"})
    assert not subsumes(root, {"$ref": "#/definitions/t"}, loose)  # loose does not require kids


def test_disjointness_holds_on_instances_when_proven():
    pairs = [(_ref("redirect"), _ref("reference")), ({"type": "string"}, {"type": "object"}),
             ({"enum": ["a"]}, {"enum": ["b", 1]}), ({"allOf": [_ref("reference"), {}]}, _ref("redirect"))]
    for a, b in pairs:
        assert disjoint(ROOT, a, b), (a, b)
        for inst in INSTANCES:
            assert not (_valid(a, inst) and _valid(b, inst)), (a, b, inst)


def test_overlap_is_never_called_disjoint():
    assert not disjoint(ROOT, _ref("content"), _ref("redirect"))  # a redirect is also content
    assert not disjoint(ROOT, {"type": "number"}, {"type": "integer"})
    assert not disjoint(ROOT, {"type": "object"}, {"properties": {"a": {"type": "string"}}})
