"""The one YAML file: defaults, field-naming errors, and no code execution."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenomy.cli import app
from tokenomy.config import Config, ConfigError, load_config


def test_no_file_runs_the_embedded_default():
    cfg = load_config(None)
    assert [m.name for m in cfg.models] == ["smollm2-135m-instruct"]
    assert cfg.models[0].backend == "embedded" and cfg.models[0].price.notional


def test_errors_name_the_bad_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("models:\n  - name: a\n    backend: embedded\n    gguf: smollm2-135m-instruct\n"
                 "    price: {input: -1}\nroutes:\n  r: {models: [a, ghost]}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "models.0.price.input" in str(e.value)
    p.write_text("models:\n  - {name: a, gguf: smollm2-135m-instruct}\nroutes:\n  r: {models: [a, ghost]}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "ghost" in str(e.value)
    p.write_text("server: {port: 99999}\n")
    with pytest.raises(ConfigError, match="server.port"):
        load_config(p)
    p.write_text("modles: []\n")
    with pytest.raises(ConfigError, match="modles"):
        load_config(p)


def test_python_object_tags_are_rejected_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.yaml"
    p.write_text(f"models: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="tag"):
        load_config(p)
    assert not marker.exists()


def test_config_check_command(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("models:\n  - {name: up, backend: openai, base_url: 'http://127.0.0.1:1/v1', "
                    "api_key_env: UP_KEY}\n")
    r = CliRunner().invoke(app, ["config", "check", str(good)])
    assert r.exit_code == 0 and "ok" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - {name: up, backend: openai}\n")
    r = CliRunner().invoke(app, ["config", "check", str(bad)])
    assert r.exit_code == 1 and "base_url" in r.output


def test_upstream_keys_come_from_the_environment_and_never_show(monkeypatch):
    monkeypatch.setenv("UP_KEY", "sk-secret-123")
    cfg = Config.model_validate({"models": [{"name": "up", "backend": "openai", "base_url": "http://127.0.0.1:1/v1",
                                             "api_key_env": "UP_KEY"}]})
    from tokenomy.backends.openai import OpenAIBackend

    b = OpenAIBackend(cfg.models[0])
    assert b.client.headers["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(b) and "sk-secret" not in str(cfg.model_dump())


def test_structured_and_semantic_settings_are_checked(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("models: [{name: smollm2-135m-instruct, structured: {wrap_up: 0.6, max_array_items: 8}}]\n"
                 "cache: {semantic: {min_margin: 0.05, embed_threads: 2}}\n")
    cfg = load_config(p)
    assert cfg.models[0].structured.wrap_up == 0.6 and cfg.models[0].structured.break_loops
    assert cfg.cache.semantic.min_margin == 0.05 and cfg.cache.semantic.embed_threads == 2
    p.write_text("models: [{name: smollm2-135m-instruct, structured: {wrap_up: 1.5}}]\n")
    with pytest.raises(ConfigError, match="wrap_up"):
        load_config(p)
    p.write_text("cache: {semantic: {min_margin: -0.1}}\n")
    with pytest.raises(ConfigError, match="min_margin"):
        load_config(p)


def test_packaged_models_start_from_their_measured_structured_settings(tmp_path):
    from tokenomy.models.catalog import PACKAGED

    shipped = PACKAGED["smollm2-135m-instruct"].structured
    default = Config.model_validate({}).models[0].structured
    assert default.wrap_up == shipped["wrap_up"] and default.max_array_items == shipped["max_array_items"]
    assert default.wrap_up is not None and default.break_loops
    p = tmp_path / "c.yaml"  # each field set in the file overrides one default; null turns it off
    p.write_text("models: [{name: smollm2-135m-instruct, structured: {wrap_up: null, max_string_length: 40}}]\n")
    st = load_config(p).models[0].structured
    assert st.wrap_up is None and st.max_string_length == 40 and st.max_array_items == shipped["max_array_items"]
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    own = Config.model_validate({"models": [{"name": "mine", "gguf": str(gguf)}]}).models[0].structured
    assert own.wrap_up is None and own.max_array_items is None   # a model nobody measured gets no bounds


def test_the_same_key_twice_and_unknown_allowed_models_are_refused() -> None:
    import pytest

    from tokenomy.config import Config

    with pytest.raises(ValueError, match="more than once"):
        Config.model_validate({"keys": [{"key": "sk-same", "tenant": "a"},
                                        {"key": "sk-same", "tenant": "b", "admin": True}]})
    import hashlib

    digest = hashlib.sha256(b"sk-same").hexdigest()
    with pytest.raises(ValueError, match="more than once"):
        Config.model_validate({"keys": [{"key": "sk-same"}, {"key_sha256": digest.upper()}]})
    with pytest.raises(ValueError, match="unknown models or routes"):
        Config.model_validate({"keys": [{"key": "sk-a", "models": ["gpt-9"]}]})


def test_a_models_engine_section_merges_over_the_top_level_one(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("engine: {n_ctx: 16384, max_model_len: 4096, n_threads: 3}\n"
                 "models:\n  - {name: a, gguf: smollm2-135m-instruct, engine: {max_running: 2, n_threads: 1}}\n"
                 "  - {name: b, gguf: gemma3-270m}\n")
    cfg = load_config(p)
    a = cfg.model("a").engine
    assert (a.n_ctx, a.max_model_len) == (16384, 4096)                 # kept from the top level
    assert (a.max_running, a.n_threads) == (2, 1)                      # the model's own keys win
    assert cfg.model("b").engine is None and cfg.engine.n_threads == 3 and cfg.engine.max_running == 16
    assert Config.model_validate(cfg.model_dump()).model("a").engine == a   # merging again changes nothing
    p.write_text("engine: {kv_unified: true}\n"
                 "models: [{name: a, gguf: smollm2-135m-instruct, engine: {context_overflow: shift}}]\n")
    with pytest.raises(ConfigError, match="model 'a'.*kv_unified false"):   # the merged section is validated
        load_config(p)


def test_each_backend_takes_only_its_own_keys(tmp_path) -> None:
    from tokenomy.config import EmbeddedModelSpec, OpenAIModelSpec

    cfg = Config.model_validate({"models": [{"name": "small", "gguf": "smollm2-135m-instruct"},
                                            {"name": "big", "backend": "openai", "base_url": "http://h:1/v1"}]})
    small, big = cfg.models
    assert isinstance(small, EmbeddedModelSpec) and small.backend == "embedded"    # the default backend
    assert isinstance(big, OpenAIModelSpec) and big.model == "big"
    assert not hasattr(small, "base_url") and not hasattr(big, "gguf") and not hasattr(big, "engine")
    p = tmp_path / "c.yaml"
    for model, message in [
            ("{name: a, gguf: smollm2-135m-instruct, base_url: 'http://h:1/v1', timeout_s: 5}",
             r"models\.0: .*base_url, timeout_s: settings of `backend: openai` models; this one is embedded"),
            ("{name: a, gguf: smollm2-135m-instruct, replicas: ['http://h:1/v1']}",
             r"models\.0: .*replicas: settings of `backend: openai`"),
            ("{name: a, backend: openai, base_url: 'http://h:1/v1', engine: {n_ctx: 4096}, structured: {}}",
             r"models\.0: .*engine, structured: settings of `backend: embedded` models; this one is openai"),
            ("{name: a, backend: vllm, base_url: 'http://h:1/v1'}",
             r"models\.0: `backend` must be embedded, openai or anthropic"),
            ("{name: a, backend: anthropic, replicas: ['http://h:1']}",
             r"models\.0: .*replicas: settings of `backend: openai` models; this one is anthropic"),
            ("{name: a, backend: openai, base_url: 'http://h:1/v1', cache_control: auto}",
             r"models\.0: .*cache_control: settings of `backend: anthropic` models; this one is openai"),
            ("{name: a, gguf: smollm2-135m-instruct, nonsense: 1}", r"models\.0\.nonsense: Extra inputs")]:
        p.write_text(f"models:\n  - {model}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(p)


def _with_named_models(data: dict) -> dict:
    """A docs fragment with routes but no models: checked with the models its routes name, as embedded ones."""
    if "models" in data or "routes" not in data:
        return data
    names = {m for r in data["routes"].values() for m in r.get("models", []) + [x["model"] for x in
                                                                                 r.get("rules", [])]}
    return {**data, "models": [{"name": n, "gguf": "smollm2-135m-instruct"} for n in sorted(names)]}


def test_every_config_in_the_readme_and_docs_loads() -> None:
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    blocks = [(f, b) for f in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
              for b in re.findall(r"```yaml\n(.*?)```", f.read_text(), re.S)]
    assert len(blocks) >= 9
    for f, block in blocks:
        try:
            Config.model_validate(_with_named_models(yaml.safe_load(block)))
        except ValueError as e:
            pytest.fail(f"a config in {f.name} does not load: {e}")


def test_models_on_the_command_line_replace_the_default_or_join_the_configs(tmp_path: Path) -> None:

    alone = load_config(None, ["hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M", "tiny=/models/tiny.gguf",
                               "gemma3-270m"])
    assert [(m.name, m.gguf) for m in alone.models] == [
        ("bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M", "hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"),
        ("tiny", "/models/tiny.gguf"), ("gemma3-270m", "gemma3-270m")]
    path = tmp_path / "c.yaml"
    path.write_text("models:\n"
                    "  - {name: remote, backend: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
                    "  - {name: local, gguf: smollm2-135m-instruct, engine: {max_running: 2}}\n"
                    "routes: {chat: {models: [remote, local]}}\n")
    cfg = load_config(path, ["local=/models/other.gguf", "/models/extra-Q4_K_M.gguf"])
    assert [(m.name, getattr(m, "gguf", None)) for m in cfg.models] == [
        ("remote", None), ("local", "/models/other.gguf"), ("extra-Q4_K_M", "/models/extra-Q4_K_M.gguf")]
    assert cfg.model("local").engine.max_running == 2          # the configured entry's other settings stay
    assert cfg.routes["chat"].models == ["remote", "local"]
