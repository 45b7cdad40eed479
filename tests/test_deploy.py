"""The deployable stack's files hold together: configs validate, compose mounts files that exist."""

from __future__ import annotations

from pathlib import Path

import yaml

from tokenomy.config import Config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_gateway_and_engine_configs_validate() -> None:
    gw = Config.model_validate(yaml.safe_load((DEPLOY / "gateway.yaml").read_text()))
    assert gw.limits.store.startswith("redis://") and gw.limits.budgets_on_store_down == "closed"
    assert gw.model("small").replicas and gw.model("small").balance.policy == "prefix"
    Config.model_validate(yaml.safe_load((DEPLOY / "engine.yaml").read_text()))


def test_compose_mounts_files_that_exist() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"proxy", "gateway-1", "gateway-2", "engine-1", "engine-2", "redis", "postgres", "prometheus",
            "grafana"} <= set(services)
    for svc in services.values():
        for volume in svc.get("volumes", []):
            src = volume.split(":")[0]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), src
