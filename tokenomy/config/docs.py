"""The config file's reference, made from its models (tokenomy/config/), so the page and the code cannot
drift: `schema()` is the JSON Schema editors complete and check the YAML with (`tokenomy config schema`), `markdown()`
is docs/config.md (`tokenomy config docs > docs/config.md`; tests/config/test_docs.py fails when the page is stale).
"""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tokenomy.config import Config

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

INTRO = """\
# Configuration reference

<!-- Generated from tokenomy/config/ by `tokenomy config docs > docs/config.md`; do not edit by hand. -->

One YAML file, every key optional: `tokenomy serve --config tokenomy.yaml`. `tokenomy config check FILE`
validates a file without starting anything and names each bad key; `tokenomy config schema > tokenomy.schema.json`
writes the JSON Schema, so an editor completes and checks the file (with the YAML language server, first line
`# yaml-language-server: $schema=tokenomy.schema.json`).

State lives in a per-user data directory unless the file says otherwise: `$TOKENOMY_HOME` when set, else
`$XDG_DATA_HOME/tokenomy`, else `~/.local/share/tokenomy`. The ledger is `ledger.db` there (`ledger.url`), the
response caches `cache/` (`cache.path`); `tokenomy serve` prints both at start.

Each section below is one mapping of the file, at the path in its heading (`[]`: each item of a list, `<name>`: a
key you choose). Types: `null` means the key may be set to null (`~`); constraints follow the type.
"""


def schema() -> dict[str, Any]:
    """The JSON Schema of the YAML file."""
    return {"$schema": SCHEMA_DIALECT, **Config.model_json_schema(), "title": "tokenomy configuration"}


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a union (Annotated and Optional seen through), else the annotation alone."""
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _members(a)]
    return [annotation]


def _models_in(annotation: Any, path: str) -> list[tuple[type[BaseModel], str]]:
    """The config models an annotation holds, each with the file path its mappings sit at."""
    found = []
    for a in _members(annotation):
        if isinstance(a, type) and issubclass(a, BaseModel):
            found.append((a, path))
        elif get_origin(a) is list:
            found += _models_in(get_args(a)[0], path + "[]")
        elif get_origin(a) is dict:
            found += _models_in(get_args(a)[1], path + ".<name>")
    return found


def sections() -> dict[type[BaseModel], list[str]]:
    """Every model of the file, top level first and then in the order the file's keys lead to them, with the paths
    it sits at."""
    out: dict[type[BaseModel], list[str]] = {Config: ["(top level)"]}
    todo: list[tuple[type[BaseModel], str]] = [(Config, "")]
    while todo:
        cls, prefix = todo.pop(0)
        for name, field in cls.model_fields.items():
            for sub, path in _models_in(field.annotation, f"{prefix}{name}"):
                if path not in out.setdefault(sub, []):
                    out[sub].append(path)
                    todo.append((sub, path + "."))
    return out


def _anchor(cls: type[BaseModel]) -> str:
    return cls.__name__.lower()


def _type(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if get_origin(annotation) is Annotated:
        return _type(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return " | ".join(_type(a) for a in get_args(annotation))
    if get_origin(annotation) is Literal:
        return " | ".join(f"`{v}`" for v in get_args(annotation))
    if get_origin(annotation) in (list, dict):
        inner = _type(get_args(annotation)[-1])
        return ("list of " if get_origin(annotation) is list else "map of ") + (f"({inner})" if " | " in inner
                                                                                 else inner)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{_anchor(annotation)})"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = ((at.Gt, "gt", ">"), (at.Ge, "ge", ">="), (at.Lt, "lt", "<"), (at.Le, "le", "<="),
           (at.MinLen, "min_length", "length >="), (at.MaxLen, "max_length", "length <="))


def _constraints(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        parts += [f"{sign} {getattr(meta, attr)}" for kind, attr, sign in _BOUNDS if isinstance(meta, kind)]
        if getattr(meta, "pattern", None):
            parts.append(f"matching `{meta.pattern}`")
    return ", ".join(parts)


def _yaml(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, list | dict) and any(isinstance(v, BaseModel) for v in value):
        return "see description"
    return "`" + json.dumps(value).replace('"', "") + "`" if value is not None else "`null`"


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return _yaml(field.default_factory())  # type: ignore[call-arg]
    return _yaml(field.default)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _heading(cls: type[BaseModel], paths: list[str]) -> str:
    where = ", ".join(f"`{p}`" for p in paths)
    tags = [f"`{name}: {get_args(f.annotation)[0]}`" for name, f in cls.model_fields.items()
            if get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1]
    return f"## {where}" + (f" with {', '.join(tags)}" if tags else "")


def markdown() -> str:
    """docs/config.md."""
    out = [INTRO.rstrip("\n")]
    for cls, paths in sections().items():
        out += ["", f'<a id="{_anchor(cls)}"></a>', "", _heading(cls, paths), "",
                " ".join((cls.__doc__ or "").split()) + f" (`{cls.__name__}`)", "",
                "| key | type | default | what it does |", "|---|---|---|---|"]
        for name, field in cls.model_fields.items():
            kind = _type(field.annotation) + (f" ({_constraints(field)})" if _constraints(field) else "")
            out.append(f"| `{name}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(field.description or '')} |")
    return "\n".join(out) + "\n"
