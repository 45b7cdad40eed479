"""The config reference and schema come from the models: every key described, the page current, the schema usable."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from tokenomy.cli import app
from tokenomy.config import Config, EmbeddedModelSpec, OpenAIModelSpec
from tokenomy.config.docs import markdown, schema, sections
from tokenomy.engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


def test_every_section_and_key_of_the_file_is_described() -> None:
    found = sections()
    assert {Config, EngineConfig, EmbeddedModelSpec, OpenAIModelSpec} <= set(found)
    assert found[EngineConfig] == ["engine", "models[].engine"]
    bare = [f"{cls.__name__}.{name}" for cls in found for name, field in cls.model_fields.items()
            if not (field.description or "").strip()]
    assert bare == [], f"fields without a description: {bare}"
    assert [cls.__name__ for cls in found if not (cls.__doc__ or "").strip()] == []
    page = markdown()
    for cls in found:
        for name, field in cls.model_fields.items():
            assert f"| `{name}` |" in page and " ".join(field.description.split())[:40] in page


def test_docs_config_md_is_current() -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == markdown(), "docs/config.md is stale: run `tokenomy config docs > docs/config.md`"


def test_the_commands_print_the_schema_and_the_page() -> None:
    r = CliRunner().invoke(app, ["config", "schema"])
    assert r.exit_code == 0 and json.loads(r.output) == schema()
    r = CliRunner().invoke(app, ["config", "docs"])
    assert r.exit_code == 0 and r.output == markdown()


def test_the_schema_accepts_the_shipped_configs_and_refuses_what_validation_refuses() -> None:
    check = jsonschema.Draft202012Validator(schema())
    for name in ("gateway.yaml", "engine.yaml"):
        check.validate(yaml.safe_load((ROOT / "deploy" / name).read_text()))
    check.validate({"models": [{"name": "a", "gguf": "smollm2-135m-instruct", "engine": {"n_ctx": 4096}}]})
    for bad in ({"models": [{"name": "a", "gguf": "x.gguf", "base_url": "http://h/v1"}]},     # openai's key
                {"models": [{"name": "a", "backend": "openai", "base_url": "http://h/v1", "gguf": "x.gguf"}]},
                {"models": [{"name": "a", "backend": "vllm"}]},
                {"engine": {"n_ctx": 16}}, {"server": {"port": "eighty"}}, {"modles": []}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)
