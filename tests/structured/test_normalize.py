import copy

import jsonschema
import pytest

from tokenomy.structured.normalize import normalize, rebase_refs


def _same_verdicts(original: dict, rewritten: dict, instances: list, cls=jsonschema.Draft7Validator) -> None:
    """The rewrite accepts exactly what the original accepts on these instances."""
    for inst in instances:
        assert cls(original).is_valid(inst) == cls(rewritten).is_valid(inst), inst


def test_property_dependencies_become_exact_anyof():
    s = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
         "dependencies": {"a": ["b"]}}
    n = normalize(s)
    assert "dependencies" not in n
    _same_verdicts(s, n, [{}, {"a": "x"}, {"a": "x", "b": "y"}, {"b": "y"}])


def test_schema_dependencies_become_exact_anyof():
    s = {"type": "object", "dependencies": {"site": {"properties": {"kind": {"enum": ["section"]}}}}}
    n = normalize(s)
    _same_verdicts(s, n, [{}, {"site": 1}, {"site": 1, "kind": "section"}, {"site": 1, "kind": "x"}, {"kind": "x"}])


def test_not_required_and_not_type_and_not_empty():
    s = {"type": "object", "not": {"required": ["a", "b"]}}
    _same_verdicts(s, normalize(s), [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}])
    s = {"properties": {"x": {"not": {"type": "array"}}}}
    n = normalize(s)
    assert "not" not in n["properties"]["x"]
    _same_verdicts(s, n, [{"x": []}, {"x": 1}, {"x": "s"}, {"x": None}, {"x": {}}])
    s = {"type": "object", "properties": {"gone": {"not": {}}}}
    _same_verdicts(s, normalize(s), [{}, {"gone": 1}, {"gone": None}])


def test_custom_formats_dropped_standard_kept():
    s = {"properties": {"a": {"type": "string", "format": "textarea"},
                        "b": {"type": "string", "format": "date-time"},
                        "format": {"type": "string"}}}  # a property named "format" is not a keyword
    n = normalize(s)
    assert "format" not in n["properties"]["a"]
    assert n["properties"]["b"]["format"] == "date-time"
    assert "format" in n["properties"]


def test_data_values_are_never_rewritten_and_input_untouched():
    s = {"const": {"format": "textarea", "$ref": "#/x"}, "enum": [{"not": {}}],
         "properties": {"r": {"$ref": "#/definitions/d", "description": "doc"}}, "definitions": {"d": {}}}
    before = copy.deepcopy(s)
    n = normalize(s)
    assert s == before
    assert n["const"] == before["const"] and n["enum"] == before["enum"]
    assert n["properties"]["r"] == {"$ref": "#/definitions/d"}  # annotation beside $ref dropped


def test_rebase_refs_moves_local_pointers_only():
    s = {"properties": {"a": {"$ref": "#/definitions/x"}, "b": {"$ref": "http://example.com/s.json"},
                        "c": {"$ref": "#"}}, "const": {"$ref": "#/keep"}}
    rebase_refs(s, "/items/0")
    assert s["properties"]["a"]["$ref"] == "#/items/0/definitions/x"
    assert s["properties"]["b"]["$ref"] == "http://example.com/s.json"
    assert s["properties"]["c"]["$ref"] == "#/items/0"
    assert s["const"] == {"$ref": "#/keep"}


@pytest.mark.parametrize("depth", [50, 3000])
def test_walk_is_iterative(depth):
    s: dict = {"type": "string", "format": "custom"}
    for _ in range(depth):
        s = {"type": "array", "items": s}
    # deepcopy is recursive, so a 3000-deep schema may raise RecursionError; the walk itself must not.
    try:
        n = normalize(s)
    except RecursionError:
        assert depth > 500
        return
    leaf = n
    while "items" in leaf:
        leaf = leaf["items"]
    assert "format" not in leaf


def test_close_objects_where_sound():
    s = {"type": "object", "properties": {"a": {"type": "object", "properties": {"x": {}}},
                                          "b": {"$ref": "#/definitions/base"},
                                          "c": {"allOf": [{"$ref": "#/definitions/mixin"},
                                                          {"properties": {"y": {}}}]},
                                          # overlapping branches (disjoint ones would become anyOf)
                                          "d": {"oneOf": [{"type": "object", "properties": {"z": {}}},
                                                          {"type": "object", "required": ["w"]}]},
                                          "e": {"properties": {"k": {}}, "required": ["k", "other"]},
                                          "f": {"type": "object"},
                                          "g": {"properties": {"m": {}}, "additionalProperties": {"type": "integer"}}},
         "definitions": {"base": {"properties": {"p": {}}}, "mixin": {"properties": {"q": {}}}}}
    n = normalize(s, close=True)
    assert n["additionalProperties"] is False
    assert n["properties"]["a"]["additionalProperties"] is False
    assert n["definitions"]["base"]["additionalProperties"] is False  # referenced plainly
    assert "additionalProperties" not in n["definitions"]["mixin"]  # referenced from an allOf
    assert "additionalProperties" not in n["properties"]["c"]["allOf"][1]
    assert "additionalProperties" not in n["properties"]["d"]["oneOf"][0]  # oneOf is not monotone
    assert "additionalProperties" not in n["properties"]["e"]  # required names a key it does not list
    assert n["properties"]["f"] == {"type": "object"}  # json_object stays open
    assert n["properties"]["g"]["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in normalize(s)  # close is opt-in
    # Narrowing only: every document the closed schema accepts, the original accepts.
    v_orig, v_new = jsonschema.Draft7Validator(s), jsonschema.Draft7Validator(n)
    docs = [{}, {"a": {"x": 1}}, {"a": {"x": 1, "w": 2}}, {"b": {"p": 1}}, {"c": {"q": 1, "y": 2}},
            {"d": {"z": 1}}, {"d": "s"}, {"e": {"k": 1, "other": 2}}, {"zz": 1}]
    for doc in docs:
        assert not v_new.is_valid(doc) or v_orig.is_valid(doc), doc
    assert v_new.is_valid({"c": {"q": 1, "y": 2}}) and v_new.is_valid({"e": {"k": 1, "other": 2}})


def test_close_objects_leaves_nested_intersections_open():
    # What normalize makes of not-required: anyOf branches inside an allOf must stay open, or {b} dies.
    s = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["b"],
         "allOf": [{"anyOf": [{"properties": {"a": False}}, {"properties": {"b": False}}]}]}
    n = normalize(s, close=True)
    assert all("additionalProperties" not in br for br in n["allOf"][0]["anyOf"])
    assert jsonschema.Draft7Validator(n).is_valid({"b": 1})


def test_bound_sizes_narrows_free_strings_and_arrays_only():
    s = {"type": "object", "properties": {
        "free": {"type": "string"},
        "long_min": {"type": "string", "minLength": 100},
        "pat": {"type": "string", "pattern": "^a+$"},
        "fmt": {"type": "string", "format": "date"},
        "own": {"type": "string", "maxLength": 500},
        "either": {"type": ["string", "null"]},
        "list": {"type": "array", "items": {"type": "string"}, "minItems": 5},
        "tuple": {"type": "array", "prefixItems": [{}, {}, {}, {}]},
        "pick": {"oneOf": [{"type": "string"}, {"type": "string", "minLength": 20}]},
        "ref_in_oneof": {"oneOf": [{"$ref": "#/definitions/s"}, {"type": "string", "minLength": 30}]},
    }, "definitions": {"s": {"type": "string"}}}
    n = normalize(s, max_length=10, max_items=3)
    p = n["properties"]
    assert p["free"]["maxLength"] == 10 and p["long_min"]["maxLength"] == 100
    assert "maxLength" not in p["pat"] and "maxLength" not in p["fmt"] and p["own"]["maxLength"] == 500
    assert p["either"]["maxLength"] == 10
    assert p["list"]["maxItems"] == 5 and p["list"]["items"]["maxLength"] == 10
    assert p["tuple"]["maxItems"] == 4
    # Under oneOf, narrowing one branch can make a document match only the other one: left alone.
    assert all("maxLength" not in b for b in p["pick"]["oneOf"])
    assert "maxLength" not in n["definitions"]["s"]
    assert "maxLength" not in normalize(s)["properties"]["free"]  # off unless asked
    # Narrowing only: whatever the bounded schema accepts, the original accepts.
    v_orig, v_new = jsonschema.Draft202012Validator(s), jsonschema.Draft202012Validator(n)
    docs = [{"free": "x" * 5}, {"free": "x" * 50}, {"pick": "y" * 30}, {"pick": "y" * 3}, {"list": ["a"] * 6},
            {"list": ["a"] * 5}, {"either": None}, {"ref_in_oneof": "z" * 40}, {"long_min": "q" * 100}]
    for doc in docs:
        assert not v_new.is_valid(doc) or v_orig.is_valid(doc), doc
    assert v_new.is_valid({"list": ["a"] * 5, "long_min": "q" * 100, "pick": "y" * 3})


# Recursive schemas shaped like the WashingtonPost ones llguidance used to refuse.
_NODE = {"type": "object", "properties": {"kind": {"enum": ["node"]},
                                          "children": {"type": "array", "items": {"$ref": "#/definitions/item"}}},
         "required": ["kind"], "additionalProperties": False}
_LEAF = {"type": "object", "properties": {"kind": {"enum": ["leaf"]}, "text": {"type": "string"}},
         "required": ["kind", "text"], "additionalProperties": False}
ONE_OF = {"definitions": {"node": _NODE, "leaf": _LEAF,
                          "item": {"oneOf": [{"$ref": "#/definitions/node"}, {"$ref": "#/definitions/leaf"}]}},
          "type": "object", "properties": {"root": {"$ref": "#/definitions/item"}}, "required": ["root"],
          "additionalProperties": False}
TYPED_ANY_OF = {"definitions": {"node": _NODE, "leaf": _LEAF,
                                "item": {"type": "object", "anyOf": [{"$ref": "#/definitions/node"},
                                                                     {"$ref": "#/definitions/leaf"}]}},
                "$ref": "#/definitions/node"}
PATTERNED = {"type": "object", "properties": {"name": {"type": "string"}, "related": {"type": "array",
                                                                                     "items": {"$ref": "#"}}},
             "patternProperties": {".*": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#"}}]}}}
TREES = [{"root": {"kind": "leaf", "text": "a"}},
         {"root": {"kind": "node", "children": [{"kind": "leaf", "text": "b"}]}},
         {"root": {"kind": "node", "children": [{"kind": "leaf"}]}}, {"root": {"kind": "leaf", "text": "a", "x": 1}},
         {"root": {"kind": "other"}}, {}]


def test_exclusive_one_of_becomes_any_of_and_overlapping_stays():
    n = normalize(ONE_OF)
    assert "anyOf" in n["definitions"]["item"] and "oneOf" not in n["definitions"]["item"]
    _same_verdicts(ONE_OF, n, TREES)
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 5}]}
    assert normalize(overlapping)["oneOf"] == overlapping["oneOf"]
    _same_verdicts(overlapping, normalize(overlapping), [1, 2.5, 7, 7.5, "s"])


def test_implied_type_beside_any_of_is_dropped():
    n = normalize(TYPED_ANY_OF)
    assert "type" not in n["definitions"]["item"]
    trees = [{"kind": "node", "children": [t["root"]]} for t in TREES if "root" in t] + [{"kind": "node"}, 1]
    _same_verdicts(TYPED_ANY_OF, n, trees)
    kept = {"type": "string", "anyOf": [{"maxLength": 2}, {"type": "integer"}]}  # the type narrows a branch
    assert normalize(kept)["type"] == "string"


def test_universal_pattern_becomes_additional_properties():
    n = normalize(PATTERNED)
    assert "patternProperties" not in n and n["additionalProperties"] == PATTERNED["patternProperties"][".*"]
    _same_verdicts(PATTERNED, n, [{}, {"name": "a"}, {"name": 1}, {"other": "x"}, {"other": 2}, {"other": [{}]},
                                  {"related": [{"name": 2}]}, {"related": [{"x": ["s"]}]}, [], "s"])
    anchored = dict(PATTERNED, patternProperties={"^[a-z]+$": PATTERNED["patternProperties"][".*"]})
    assert "patternProperties" in normalize(anchored)  # does not match every name: left alone
    narrower = {"type": "object", "properties": {"a": {"type": "string"}},
                "patternProperties": {".*": {"maxLength": 3}}}
    assert "patternProperties" in normalize(narrower)  # "a" would lose maxLength: left alone


def test_recursive_schemas_llguidance_refused_now_compile(compiler):
    import llguidance

    from tokenomy.structured.schema import JSON_OPTIONS, json_schema_format

    for schema in (ONE_OF, TYPED_ANY_OF, PATTERNED):
        raw = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        reason = llguidance.LLMatcher.validate_grammar(raw)
        assert "circular references" in reason or "oneOf" in reason  # refused as written
        assert compiler.compile(json_schema_format(schema)).compile_ms >= 0


def _narrower(original: dict, rewritten: dict, instances: list) -> None:
    """Every instance the rewrite accepts, the original accepts (and some the original accepts, it refuses)."""
    cls = jsonschema.Draft202012Validator
    accepted = [i for i in instances if cls(rewritten).is_valid(i)]
    assert accepted and all(cls(original).is_valid(i) for i in accepted), accepted


def test_relax_narrows_where_it_can_and_names_what_it_widens():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}},
         "minProperties": 2}
    relaxed: set[str] = set()
    n = normalize(s, relaxed=relaxed)
    assert n["required"] == ["a", "b"] and "minProperties" not in n and relaxed == set()
    _narrower(s, n, [{}, {"a": 1}, {"a": 1, "c": 2}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}])
    s = {"type": "array", "contains": {"type": "string"}, "minContains": 2}
    n = normalize(s, relaxed=relaxed)
    assert n == {"type": "array", "minItems": 2} and relaxed == {"contains"}   # the count kept, a narrowing
    assert normalize({"oneOf": [{"type": "integer"}, {"type": "number"}]}, relaxed=relaxed)["anyOf"]
    assert relaxed == {"contains", "oneOf"}
    # without `relaxed` nothing is widened: the caller gets the schema llguidance refuses, as before
    assert "oneOf" in normalize({"oneOf": [{"type": "integer"}, {"type": "number"}]})


def test_a_relaxed_one_of_keeps_its_branches_open():
    """Closing the branches of an overlapping oneOf would shut out the only answers that match exactly one: here
    {"a": 1} matches both, and {"a": 1, "b": "x"} only the first, which a closed first branch refuses."""
    s = {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                   {"type": "object", "properties": {"b": {"type": "integer"}}}]}
    n = normalize(s, close=True, relaxed=set())
    assert all("additionalProperties" not in b for b in n["anyOf"])
    valid = {"a": 1, "b": "x"}
    assert jsonschema.Draft202012Validator(s).is_valid(valid) and jsonschema.Draft202012Validator(n).is_valid(valid)


def test_long_max_length_beside_a_pattern_is_lowered():
    from tokenomy.structured.normalize import PATTERN_MAX_LENGTH

    s = {"properties": {"q": {"type": "string", "pattern": "^[a-z ]*$", "maxLength": 5000},
                        "r": {"type": "string", "maxLength": 5000},
                        "s": {"type": "string", "pattern": "^a", "minLength": 900, "maxLength": 5000}}}
    n = normalize(s)
    assert n["properties"]["q"]["maxLength"] == PATTERN_MAX_LENGTH
    assert n["properties"]["r"]["maxLength"] == 5000                  # no pattern: the lexer copes
    assert n["properties"]["s"]["maxLength"] == 900                   # never below minLength
    _narrower(s, n, [{"q": "a" * 10}, {"q": "a" * 600}, {"r": "x" * 4000}])


def test_narrow_for_repair_caps_unique_lists_that_may_hold_one_item():
    from tokenomy.structured.normalize import narrow_for_repair

    s = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "pair": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
        "free": {"type": "array", "items": {"type": "string"}}}}
    n = narrow_for_repair(s)
    assert n is not None and n["properties"]["tags"]["maxItems"] == 1 and "maxItems" not in s["properties"]["tags"]
    assert "maxItems" not in n["properties"]["pair"] and "maxItems" not in n["properties"]["free"]
    _narrower(s, n, [{"tags": ["a"]}, {"tags": ["a", "a"]}, {"tags": ["a", "b"]}, {"pair": ["a", "b"]}])
    assert narrow_for_repair({"type": "array", "uniqueItems": True, "maxItems": 1}) is None
