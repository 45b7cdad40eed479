"""`tokenomy keys|tenants|spend ...`: the admin API (api/admin.py) from the command line, over HTTP against a
running server: $TOKENOMY_URL (default http://127.0.0.1:8000) with $TOKENOMY_ADMIN_KEY. Tables on a terminal,
`--json` for scripts (the API's JSON as it came). An error answer prints its message and exits 1."""

from __future__ import annotations

import json
from typing import Any

import typer

URL = typer.Option("http://127.0.0.1:8000", "--url", envvar="TOKENOMY_URL", help="The server's root URL.")
ADMIN_KEY = typer.Option(None, "--admin-key", envvar="TOKENOMY_ADMIN_KEY", help="An admin key.")
JSON = typer.Option(False, "--json", help="Print the API's JSON instead of a table.")

keys = typer.Typer(no_args_is_help=True, help="Make, list, change, revoke and rotate API keys (admin API).")
tenants = typer.Typer(no_args_is_help=True, help="Make, list, change and delete tenants (admin API).")

KEY_COLUMNS = ("id", "name", "tenant", "role", "rpm", "tpm", "models", "budget", "expires_at", "revoked_at", "source")
TENANT_COLUMNS = ("name", "rpm", "tpm", "models", "budget", "source")
SPEND_COLUMNS = ("requests", "input_tokens", "output_tokens", "cached_tokens", "cost_usd")


def call(method: str, path: str, url: str, admin_key: str | None, body: dict[str, Any] | None = None,
         params: dict[str, Any] | None = None) -> Any:
    """One admin API call; its JSON, or the error's message on stderr and exit 1."""
    import httpx

    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        r = httpx.request(method, url.rstrip("/") + path, json=body, headers=headers, timeout=30,
                          params={k: v for k, v in (params or {}).items() if v is not None})
    except httpx.HTTPError as e:
        typer.echo(f"tokenomy: cannot reach {url}: {e}", err=True)
        raise typer.Exit(1) from None
    try:
        data = r.json()
    except ValueError:
        data = None
    if r.status_code >= 400:
        message = data["error"]["message"] if isinstance(data, dict) and "error" in data else r.text
        typer.echo(f"tokenomy: {r.status_code}: {message}", err=True)
        raise typer.Exit(1)
    return data


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None and k != "warn_at")
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") or "0"
    return str(value)


def show(data: Any, columns: tuple[str, ...], as_json: bool, title: str | None = None) -> None:
    """A list's rows (or one object) as a rich table, or the JSON."""
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    rows = data["data"] if isinstance(data, dict) and "data" in data else [data]
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    Console().print(table)


def _settings(name: str | None = None, role: str | None = None, rpm: int | None = None, tpm: int | None = None,
              models: str | None = None, usd_per_day: float | None = None, usd_per_month: float | None = None,
              tokens_per_day: int | None = None, tokens_per_month: int | None = None,
              expires_at: str | None = None, metadata: str | None = None) -> dict[str, Any]:
    """The body fields given on the command line (those left out are not sent: a PATCH keeps them)."""
    body: dict[str, Any] = {k: v for k, v in (("name", name), ("role", role), ("rpm", rpm), ("tpm", tpm),
                                              ("expires_at", expires_at)) if v is not None}
    if models is not None:
        body["models"] = [m for m in models.split(",") if m] or None
    budget = {k: v for k, v in (("usd_per_day", usd_per_day), ("usd_per_month", usd_per_month),
                                ("tokens_per_day", tokens_per_day), ("tokens_per_month", tokens_per_month))
              if v is not None}
    if budget:
        body["budget"] = budget
    if metadata is not None:
        try:
            body["metadata"] = json.loads(metadata)
        except ValueError as e:
            raise typer.BadParameter(f"not JSON: {e}", param_hint="--metadata") from None
    return body


ROLE = typer.Option(None, help="user | tenant_admin | admin")
RPM = typer.Option(None, help="Requests per minute.")
TPM = typer.Option(None, help="Tokens per minute.")
MODELS = typer.Option(None, help="Comma-separated model and route names it may use ('' : all).")
USD_DAY = typer.Option(None, "--usd-per-day")
USD_MONTH = typer.Option(None, "--usd-per-month")
TOKENS_DAY = typer.Option(None, "--tokens-per-day")
TOKENS_MONTH = typer.Option(None, "--tokens-per-month")
EXPIRES = typer.Option(None, "--expires-at", help="ISO 8601 datetime or UNIX seconds.")
METADATA = typer.Option(None, help="A JSON object.")


@keys.command("create")
def keys_create(name: str = typer.Option("key", help="A label."),
                tenant: str | None = typer.Option(None, help="Its tenant (default: yours, or 'default')."),
                role: str | None = ROLE, rpm: int | None = RPM, tpm: int | None = TPM, models: str | None = MODELS,
                usd_per_day: float | None = USD_DAY, usd_per_month: float | None = USD_MONTH,
                tokens_per_day: int | None = TOKENS_DAY, tokens_per_month: int | None = TOKENS_MONTH,
                expires_at: str | None = EXPIRES, metadata: str | None = METADATA,
                url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Make a key; its plain text is printed this once (the server keeps only its hash)."""
    body = _settings(name, role, rpm, tpm, models, usd_per_day, usd_per_month, tokens_per_day, tokens_per_month,
                     expires_at, metadata)
    if tenant is not None:
        body["tenant"] = tenant
    made = call("POST", "/admin/keys", url, admin_key, body)
    show(made, KEY_COLUMNS, as_json)
    if not as_json:
        typer.echo(f"key: {made['key']}  (shown once: keep it now)")


@keys.command("list")
def keys_list(tenant: str | None = typer.Option(None, help="Only this tenant's."),
              url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Every key you may see (never a secret); config-file keys say source config."""
    data = call("GET", "/admin/keys", url, admin_key)
    if tenant is not None:
        data["data"] = [k for k in data["data"] if k["tenant"] == tenant]
    show(data, KEY_COLUMNS, as_json)


@keys.command("show")
def keys_show(key_id: str, url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """One key."""
    show(call("GET", f"/admin/keys/{key_id}", url, admin_key), KEY_COLUMNS, as_json)


@keys.command("update")
def keys_update(key_id: str, name: str | None = typer.Option(None), role: str | None = ROLE,
                rpm: int | None = RPM, tpm: int | None = TPM, models: str | None = MODELS,
                usd_per_day: float | None = USD_DAY, usd_per_month: float | None = USD_MONTH,
                tokens_per_day: int | None = TOKENS_DAY, tokens_per_month: int | None = TOKENS_MONTH,
                expires_at: str | None = EXPIRES, metadata: str | None = METADATA,
                url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Change what is given; the rest stays. A budget given replaces the key's budget whole."""
    body = _settings(name, role, rpm, tpm, models, usd_per_day, usd_per_month, tokens_per_day, tokens_per_month,
                     expires_at, metadata)
    show(call("PATCH", f"/admin/keys/{key_id}", url, admin_key, body), KEY_COLUMNS, as_json)


@keys.command("revoke")
def keys_revoke(key_id: str, force: bool = typer.Option(False, "--force", help="Even the last admin key."),
                url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Revoke a key: refused from now on, on every gateway."""
    data = call("DELETE", f"/admin/keys/{key_id}", url, admin_key, params={"force": "true" if force else None})
    show(data, KEY_COLUMNS, as_json)


@keys.command("rotate")
def keys_rotate(key_id: str, grace: float = typer.Option(0.0, "--grace", min=0, help="Seconds the old key "
                                                         "stays valid."),
                url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """A new key with the old one's settings; the old one is refused after --grace seconds."""
    made = call("POST", f"/admin/keys/{key_id}/rotate", url, admin_key, {"grace_s": grace})
    show(made, KEY_COLUMNS, as_json)
    if not as_json:
        typer.echo(f"key: {made['key']}  (shown once: keep it now)")


@tenants.command("create")
def tenants_create(name: str, rpm: int | None = RPM, tpm: int | None = TPM, models: str | None = MODELS,
                   usd_per_day: float | None = USD_DAY, usd_per_month: float | None = USD_MONTH,
                   tokens_per_day: int | None = TOKENS_DAY, tokens_per_month: int | None = TOKENS_MONTH,
                   metadata: str | None = METADATA,
                   url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Make a tenant."""
    body = {"name": name, **_settings(None, None, rpm, tpm, models, usd_per_day, usd_per_month, tokens_per_day,
                                      tokens_per_month, None, metadata)}
    show(call("POST", "/admin/tenants", url, admin_key, body), TENANT_COLUMNS, as_json)


@tenants.command("list")
def tenants_list(url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Every tenant you may see; config-file tenants say source config."""
    show(call("GET", "/admin/tenants", url, admin_key), TENANT_COLUMNS, as_json)


@tenants.command("show")
def tenants_show(name: str, url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """One tenant."""
    show(call("GET", f"/admin/tenants/{name}", url, admin_key), TENANT_COLUMNS, as_json)


@tenants.command("update")
def tenants_update(name: str, rpm: int | None = RPM, tpm: int | None = TPM, models: str | None = MODELS,
                   usd_per_day: float | None = USD_DAY, usd_per_month: float | None = USD_MONTH,
                   tokens_per_day: int | None = TOKENS_DAY, tokens_per_month: int | None = TOKENS_MONTH,
                   metadata: str | None = METADATA,
                   url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Change what is given; the rest stays."""
    body = _settings(None, None, rpm, tpm, models, usd_per_day, usd_per_month, tokens_per_day, tokens_per_month,
                     None, metadata)
    show(call("PATCH", f"/admin/tenants/{name}", url, admin_key, body), TENANT_COLUMNS, as_json)


@tenants.command("delete")
def tenants_delete(name: str, url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Delete a tenant that has no live key."""
    data = call("DELETE", f"/admin/tenants/{name}", url, admin_key)
    typer.echo(json.dumps(data, indent=2) if as_json else f"deleted {name}")


def spend(by: str = typer.Option("tenant", "--by", help="tenant | key | model | user | day"),
          since: str | None = typer.Option(None, help="ISO date or datetime, or a duration before now: 7d, 24h."),
          until: str | None = typer.Option(None, help="As --since; default now."),
          url: str = URL, admin_key: str | None = ADMIN_KEY, as_json: bool = JSON) -> None:
    """Requests, tokens and USD by one dimension, from the ledger (the same figures as `tokenomy report`)."""
    data = call("GET", "/admin/spend", url, admin_key, params={"group_by": by, "since": since, "until": until})
    if as_json:
        show(data, (), True)
        return
    show({"data": [*data["data"], {by: "total", **data["total"]}]}, (by, *SPEND_COLUMNS), False,
         title=f"spend by {by}")
