"""The admin API: thin endpoints over the key store (limits/key_store.py), the ledger's spend and the audit.

    GET|POST          /admin/tenants            GET|PATCH|DELETE /admin/tenants/{name}
    GET|POST          /admin/keys               GET|PATCH|DELETE /admin/keys/{id}   (DELETE revokes)
    POST              /admin/keys/{id}/rotate   {"grace_s"}: a new key; the old one valid grace_s more seconds
    GET               /admin/spend?group_by=tenant|key|model|user|day (or two: day,tenant)&since=&until=
    GET               /admin/audit?limit=
    GET               /admin                    the page: tenants and keys with spend against budget, create,
                                                revoke, rotate, spend over time (admin_page.html)

Only admin keys: a global admin (role admin, or `admin: true` in the config) sees and changes everything; a tenant
admin (role tenant_admin) sees its tenant's keys, spend and audit and manages its tenant's keys, never another
tenant's rows, never a tenant or a global admin key. With no key configured anywhere the gateway is open, these
endpoints too (the first admin key closes it). Failed authentication is counted per source address
(limits/auth_failures.py). A change answers once this gateway's keyring holds it (Gateway.refresh_keys); the other
gateways load it within a second (their poll). Config-file keys and tenants are listed read-only (source: config).
JSON in and out; errors in OpenAI's shape.
"""

from __future__ import annotations

from functools import lru_cache, partial
from importlib import resources
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from tokenomy.api.body import read_json
from tokenomy.config import BudgetLimits
from tokenomy.dialect.chat import body_error
from tokenomy.errors import APIError
from tokenomy.gateway import Gateway
from tokenomy.limits.auth_failures import AuthFailures
from tokenomy.limits.key_store import Actor, KeyStore, StoredKey, StoredTenant
from tokenomy.limits.keys import key_id_of
from tokenomy.report.figures import parse_time
from tokenomy.report.page import plotly_js
from tokenomy.report.spend import dimensions, spend

MAX_BODY = 64 * 1024
NAME = r"^[A-Za-z0-9_.:@-]{1,128}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantPatch(_Body):
    budget: BudgetLimits | None = None
    models: list[str] | None = None
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TenantBody(TenantPatch):
    name: str = Field(pattern=NAME)


class KeyPatch(_Body):
    name: str = Field("key", min_length=1, max_length=128)
    role: Literal["user", "tenant_admin", "admin"] = "user"
    budget: BudgetLimits | None = None
    models: list[str] | None = None
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    expires_at: float | None = Field(None, description="UNIX seconds or an ISO 8601 datetime; null: never")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("expires_at", mode="before")
    @classmethod
    def _when(cls, v: Any) -> Any:
        return parse_time(v) if isinstance(v, str) else v


class KeyBody(KeyPatch):
    tenant: str | None = Field(None, pattern=NAME, description="default: the caller's tenant (a tenant admin's), "
                               "else 'default'")


class RotateBody(_Body):
    grace_s: float = Field(0.0, ge=0, le=30 * 86400)


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _failures(request: Request) -> AuthFailures:
    failures: AuthFailures = request.app.state.auth_failures
    return failures


def actor(request: Request) -> Actor:
    """The admin calling: a global admin (Actor.tenant None), a tenant admin, else 401/403. Failed authentication
    counts against the source address; too many answer 429 before the key is looked at."""
    keyring = _gateway(request).keyring
    if not keyring.enabled:
        return Actor(None)
    source = request.client.host if request.client is not None else "?"
    failures = _failures(request)
    failures.check(source)
    try:
        info = keyring.lookup(request.headers.get("authorization"))
    except APIError:
        failures.failed(source)
        raise
    if info.admin:
        return Actor(info.key_id)
    if info.tenant_admin:
        return Actor(info.key_id, info.tenant)
    failures.failed(source)
    raise APIError(403, "This endpoint needs an admin key.", code="not_admin")


def _global(who: Actor) -> None:
    if who.tenant is not None:
        raise APIError(403, "Only a global admin key may do this.", code="not_global_admin")


def _store(request: Request) -> KeyStore:
    store = _gateway(request).parts.running.key_store
    if store is None:
        raise APIError(400, "Keys and tenants are managed in the ledger's database: configure `ledger` first.",
                       code="no_database")
    return store


async def _parse(request: Request, model: type[BaseModel], empty_ok: bool = False) -> Any:
    if empty_ok and request.headers.get("content-length") in (None, "0"):
        return model()
    data = await read_json(request, MAX_BODY)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise body_error(list(e.errors())) from e


async def _changed(request: Request) -> None:
    """This gateway takes the change before answering."""
    await run_in_threadpool(_gateway(request).refresh_keys)


def _config_tenants(request: Request) -> dict[str, dict[str, Any]]:
    config = _gateway(request).config
    return {n: {"name": n, "budget": t.budget.model_dump() if t.budget else None, "models": t.models,
                "rpm": None, "tpm": None, "metadata": {}, "source": "config"} for n, t in config.tenants.items()}


def _config_keys(request: Request) -> list[dict[str, Any]]:
    return [{"id": key_id_of(k), "name": k.name, "tenant": k.tenant, "role": "admin" if k.admin else "user",
             "budget": k.budget.model_dump() if k.budget else None, "models": k.models, "rpm": k.rpm, "tpm": k.tpm,
             "expires_at": None, "metadata": {}, "revoked_at": None, "source": "config"}
            for k in _gateway(request).config.keys]


# ---- tenants -------------------------------------------------------------------------------------------------
async def list_tenants(request: Request) -> dict[str, Any]:
    who = actor(request)
    stored = _gateway(request).parts.stored
    rows = [*_config_tenants(request).values(),
            *(t.public() for t in (stored.tenants.values() if stored is not None else ()))]
    return {"object": "list", "data": [t for t in rows if who.tenant is None or t["name"] == who.tenant]}


async def create_tenant(request: Request) -> JSONResponse:
    who = actor(request)
    _global(who)
    body: TenantBody = await _parse(request, TenantBody)
    if body.name in _gateway(request).config.tenants:
        raise APIError(409, f"Tenant {body.name!r} is in the config file (read-only).", code="conflict")
    t = await run_in_threadpool(_store(request).create_tenant, who, StoredTenant(**body.model_dump(
        exclude={"budget"}), budget=body.budget))
    await _changed(request)
    return JSONResponse(t.public(), status_code=201)


def _tenant_row(request: Request, who: Actor, name: str) -> dict[str, Any]:
    who.may(name)
    config = _config_tenants(request)
    if name in config:
        return config[name]
    stored = _gateway(request).parts.stored
    if stored is None or name not in stored.tenants:
        raise APIError(404, f"No tenant {name!r}.", code="not_found")
    return stored.tenants[name].public()


async def get_tenant(name: str, request: Request) -> dict[str, Any]:
    return _tenant_row(request, actor(request), name)


def _read_only(row: dict[str, Any], what: str) -> None:
    if row.get("source") == "config":
        raise APIError(403, f"{what} is in the config file: change it there and reload.", code="read_only")


async def update_tenant(name: str, request: Request) -> dict[str, Any]:
    who = actor(request)
    _global(who)
    _read_only(_tenant_row(request, who, name), f"Tenant {name!r}")
    body: TenantPatch = await _parse(request, TenantPatch)
    changes = {f: getattr(body, f) for f in body.model_fields_set}
    t = await run_in_threadpool(_store(request).update_tenant, who, name, changes)
    await _changed(request)
    return t.public()


async def delete_tenant(name: str, request: Request) -> dict[str, Any]:
    who = actor(request)
    _global(who)
    _read_only(_tenant_row(request, who, name), f"Tenant {name!r}")
    await run_in_threadpool(_store(request).delete_tenant, who, name)
    await _changed(request)
    return {"name": name, "deleted": True}


# ---- keys ----------------------------------------------------------------------------------------------------
async def list_keys(request: Request) -> dict[str, Any]:
    who = actor(request)
    stored = _gateway(request).parts.stored
    rows = [*_config_keys(request), *(k.public() for k in (stored.keys if stored is not None else ()))]
    return {"object": "list", "data": [k for k in rows if who.tenant is None or k["tenant"] == who.tenant]}


def _known_tenant(request: Request, tenant: str) -> None:
    gateway = _gateway(request)
    stored = gateway.parts.stored
    if tenant == "default" or tenant in gateway.config.tenants or (stored is not None and tenant in stored.tenants):
        return
    raise APIError(404, f"No tenant {tenant!r}: create it first (POST /admin/tenants).", param="tenant",
                   code="not_found")


async def create_key(request: Request) -> JSONResponse:
    who = actor(request)
    body: KeyBody = await _parse(request, KeyBody)
    tenant = body.tenant or who.tenant or "default"
    who.may(tenant)
    if body.role == "admin":
        _global(who)
    _known_tenant(request, tenant)
    fields = body.model_dump(exclude={"tenant", "budget"})
    key, plain = await run_in_threadpool(_store(request).create_key, who,
                                         StoredKey(id="", key_sha256="", tenant=tenant, budget=body.budget, **fields))
    await _changed(request)
    return JSONResponse({**key.public(), "key": plain}, status_code=201)


def _key_row(request: Request, who: Actor, key_id: str) -> dict[str, Any]:
    for k in _config_keys(request):
        if k["id"] == key_id and (who.tenant is None or k["tenant"] == who.tenant):
            return k
    key = _store(request).get_key(key_id)
    if key is None or (who.tenant is not None and key.tenant != who.tenant):
        raise APIError(404, f"No key {key_id!r}.", code="not_found")
    return key.public()


async def get_key(key_id: str, request: Request) -> dict[str, Any]:
    who = actor(request)
    return await run_in_threadpool(_key_row, request, who, key_id)


async def update_key(key_id: str, request: Request) -> dict[str, Any]:
    who = actor(request)
    _read_only(await run_in_threadpool(_key_row, request, who, key_id), f"Key {key_id!r}")
    body: KeyPatch = await _parse(request, KeyPatch)
    if body.role == "admin" and "role" in body.model_fields_set:
        _global(who)
    changes = {f: getattr(body, f) for f in body.model_fields_set}
    key = await run_in_threadpool(partial(_store(request).update_key, admins_left=_admins_left(request)),
                                  who, key_id, changes)
    await _changed(request)
    return key.public()


def _admins_left(request: Request) -> int | None:
    """The config file's admin keys (they stay whatever the database holds); None with ?force=true."""
    if request.query_params.get("force", "").lower() in ("1", "true", "yes"):
        return None
    return sum(1 for k in _gateway(request).config.keys if k.admin)


async def revoke_key(key_id: str, request: Request) -> dict[str, Any]:
    who = actor(request)
    _read_only(await run_in_threadpool(_key_row, request, who, key_id), f"Key {key_id!r}")
    key = await run_in_threadpool(partial(_store(request).revoke_key, admins_left=_admins_left(request)),
                                  who, key_id)
    await _changed(request)
    return key.public()


async def rotate_key(key_id: str, request: Request) -> JSONResponse:
    who = actor(request)
    _read_only(await run_in_threadpool(_key_row, request, who, key_id), f"Key {key_id!r}")
    body: RotateBody = await _parse(request, RotateBody, empty_ok=True)
    key, plain = await run_in_threadpool(_store(request).rotate_key, who, key_id, body.grace_s)
    await _changed(request)
    return JSONResponse({**key.public(), "key": plain, "rotated_from": key_id}, status_code=201)


# ---- spend and audit -----------------------------------------------------------------------------------------
def _time(request: Request, param: str) -> float | None:
    try:
        return parse_time(request.query_params.get(param))
    except ValueError as e:
        raise APIError(400, f"Invalid value for '{param}': {e}", param=param, code="invalid_time") from e


async def get_spend(request: Request) -> dict[str, Any]:
    """The ledger's rows over since <= ts < until (a tenant admin: its tenant's), grouped (report/spend.py)."""
    who = actor(request)
    group_by = request.query_params.get("group_by", "tenant")
    try:
        dimensions(group_by)
    except ValueError as e:
        raise APIError(400, str(e), param="group_by", code="invalid_value") from e
    since, until = _time(request, "since"), _time(request, "until")
    if since is not None and until is not None and since > until:
        raise APIError(400, "since is after until", param="since", code="invalid_value")
    ledger = _gateway(request).ledger
    if ledger is None:
        raise APIError(400, "Spend is read from the ledger: configure `ledger` first.", code="no_database")

    def read() -> dict[str, Any]:
        ledger.flush()          # what this gateway has served so far counts
        return spend(ledger.query(since=since, until=until, tenant=who.tenant), group_by)

    return {**await run_in_threadpool(read), "since": since, "until": until}


async def get_audit(request: Request) -> dict[str, Any]:
    who = actor(request)
    try:
        limit = min(max(int(request.query_params.get("limit", "100")), 1), 1000)
    except ValueError as e:
        raise APIError(400, "limit must be an integer", param="limit", code="invalid_value") from e
    rows = await run_in_threadpool(_store(request).audit, who.tenant, limit)
    return {"object": "list", "data": rows}


async def reload(request: Request) -> dict[str, Any]:
    who = actor(request)
    _global(who)
    gateway = _gateway(request)
    done = await run_in_threadpool(gateway.reload)
    store = gateway.parts.running.key_store
    if store is not None:
        await run_in_threadpool(store.note, who, "reload", "config", gateway.config_path or "", done)
    return done


@lru_cache(maxsize=1)
def page_html() -> str:
    """The admin page (admin_page.html) with plotly.js inline: it loads nothing from the network, holds no data,
    and calls the endpoints above with the key given as /admin#key=... (kept in the tab's sessionStorage)."""
    template = resources.files("tokenomy.api").joinpath("admin_page.html").read_text(encoding="utf-8")
    return template.replace("__PLOTLY_JS__", plotly_js())


async def page(request: Request) -> HTMLResponse:
    return HTMLResponse(await run_in_threadpool(page_html), headers={"cache-control": "no-store"})


ROUTES = [
    APIRoute("/admin", page, methods=["GET"], response_class=HTMLResponse, include_in_schema=False),
    APIRoute("/admin/tenants", list_tenants, methods=["GET"]),
    APIRoute("/admin/tenants", create_tenant, methods=["POST"]),
    APIRoute("/admin/tenants/{name}", get_tenant, methods=["GET"]),
    APIRoute("/admin/tenants/{name}", update_tenant, methods=["PATCH"]),
    APIRoute("/admin/tenants/{name}", delete_tenant, methods=["DELETE"]),
    APIRoute("/admin/keys", list_keys, methods=["GET"]),
    APIRoute("/admin/keys", create_key, methods=["POST"]),
    APIRoute("/admin/keys/{key_id}", get_key, methods=["GET"]),
    APIRoute("/admin/keys/{key_id}", update_key, methods=["PATCH"]),
    APIRoute("/admin/keys/{key_id}", revoke_key, methods=["DELETE"]),
    APIRoute("/admin/keys/{key_id}/rotate", rotate_key, methods=["POST"]),
    APIRoute("/admin/spend", get_spend, methods=["GET"]),
    APIRoute("/admin/audit", get_audit, methods=["GET"]),
    APIRoute("/admin/reload", reload, methods=["POST"]),
]
