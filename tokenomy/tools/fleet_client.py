"""`tokenomy ps`, `tokenomy load NAME`, `tokenomy unload NAME`: the fleet of a running server, from a terminal
(its /admin/models routes; an admin key when the server has keys)."""

from __future__ import annotations

from typing import Any

import httpx
import typer

BASE = typer.Option("http://127.0.0.1:8000/v1", "--base-url", envvar="TOKENOMY_BASE_URL", help="The server's /v1 URL.")
KEY = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="An admin key (default $OPENAI_API_KEY).")
GIB = 1 << 30


def _call(method: str, base_url: str, api_key: str | None, path: str) -> dict[str, Any]:
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.request(method, f"{root}{path}", headers=headers, timeout=600)
    except httpx.HTTPError as e:
        typer.echo(f"tokenomy: {root} does not answer: {e}", err=True)
        raise typer.Exit(1) from None
    body = r.json()
    if r.status_code >= 400:
        typer.echo(f"tokenomy: {r.status_code}: {body.get('error', {}).get('message', body)}", err=True)
        raise typer.Exit(1)
    return body


def table(view: dict[str, Any]) -> str:
    """The ps view as Ollama's `ollama ps` shows it, with tokenomy's figures."""
    rows = [("NAME", "STATE", "EST GiB", "RSS GiB", "IDLE s", "KEEP s", "LOADS", "EVICTED", "LOAD s")]
    for m in view["models"]:
        keep = m["keep_alive_left_s"]
        rows.append((m["name"], m["state"] + (" (pinned)" if m["pinned"] else ""), f"{m['memory_bytes'] / GIB:.2f}",
                     "-" if m["rss_bytes"] is None else f"{m['rss_bytes'] / GIB:.2f}", f"{m['idle_s']:.0f}",
                     "forever" if keep is None and m["state"] == "loaded" else "-" if keep is None else f"{keep:.0f}",
                     str(m["loads"]), str(m["evictions"]), "-" if m["load_s"] is None else f"{m['load_s']:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(f"memory: {view['memory_held_bytes'] / GIB:.2f} of {view['memory_limit_bytes'] / GIB:.2f} GiB held "
                 f"({view['memory_limit_source']})")
    for device, pool in (view.get("gpus") or {}).items():
        lines.append(f"{device}: {pool['memory_held_bytes'] / GIB:.2f} of {pool['memory_limit_bytes'] / GIB:.2f} GiB "
                     f"held ({pool['memory_limit_source']})")
    return "\n".join(lines)


def ps(base_url: str = BASE, api_key: str | None = KEY) -> None:
    """The server's embedded models: loaded or not, memory estimated and measured, idle time, keep-alive left."""
    typer.echo(table(_call("GET", base_url, api_key, "/admin/models")))


def load(name: str = typer.Argument(..., help="a model the server lists"), base_url: str = BASE,
         api_key: str | None = KEY) -> None:
    """Load a model on the running server now (evicting idle ones if it must)."""
    m = _call("POST", base_url, api_key, f"/admin/models/{name}/load")
    typer.echo(f"{name}: {m['state']} (loaded in {m['load_s']:.2f} s)" if m.get("load_s") else f"{name}: {m['state']}")


def unload(name: str = typer.Argument(..., help="a loaded model"), base_url: str = BASE,
           api_key: str | None = KEY) -> None:
    """Unload a model on the running server (when its running requests end); its engine process ends."""
    typer.echo(f"{name}: {_call('POST', base_url, api_key, f'/admin/models/{name}/unload')['outcome']}")
