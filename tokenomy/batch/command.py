"""`tokenomy batch submit FILE | status ID | results ID`: the Batch API from the command line, over HTTP with the
official openai client (so it works against tokenomy or any OpenAI-compatible server with a Batch API)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(no_args_is_help=True, help="Submit batches of requests, follow them and fetch their results.")

DONE = ("completed", "failed", "cancelled", "expired")
BASE = typer.Option("http://127.0.0.1:8000/v1", "--base-url", envvar="TOKENOMY_BASE_URL", help="The server's /v1 URL.")
KEY = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="API key (default $OPENAI_API_KEY).")


def _client(base_url: str, api_key: str | None) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                         max_retries=2)


def _line(b: Any) -> str:
    n = b.request_counts
    return (f"{b.id}  {b.status}  {n.completed + n.failed}/{n.total} done ({n.completed} ok, {n.failed} failed)"
            if n is not None else f"{b.id}  {b.status}")


def _follow(client: Any, batch_id: str, poll_s: float) -> Any:
    """Poll the batch, drawing a progress bar, until it ends."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task(batch_id, total=None)
        while True:
            b = client.batches.retrieve(batch_id)
            n = b.request_counts
            if n is not None:
                bar.update(task, total=n.total or None, completed=n.completed + n.failed,
                           description=f"{batch_id} {b.status}")
            if b.status in DONE:
                return b
            time.sleep(poll_s)


@app.command()
def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSONL of requests (OpenAI batch format)."),
    endpoint: str = typer.Option("/v1/chat/completions", help="/v1/chat/completions or /v1/completions."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow the batch with a progress bar until it ends."),
    poll_s: float = typer.Option(1.0, "--poll", help="Seconds between status checks."),
    base_url: str = BASE, api_key: str | None = KEY,
) -> None:
    """Upload FILE and start a batch on it; print the batch id (and follow it unless --no-wait)."""
    client = _client(base_url, api_key)
    with file.open("rb") as fh:
        f = client.files.create(file=(file.name, fh), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    typer.echo(b.id)
    if wait:
        typer.echo(_line(_follow(client, b.id, poll_s)))


@app.command()
def status(
    batch_id: str = typer.Argument(...),
    wait: bool = typer.Option(False, "--wait", help="Follow it with a progress bar until it ends."),
    poll_s: float = typer.Option(1.0, "--poll"),
    base_url: str = BASE, api_key: str | None = KEY,
) -> None:
    """One line of the batch's state: status and request counts."""
    client = _client(base_url, api_key)
    typer.echo(_line(_follow(client, batch_id, poll_s) if wait else client.batches.retrieve(batch_id)))


@app.command()
def results(
    batch_id: str = typer.Argument(...),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the output lines here (default stdout)."),
    errors: Path | None = typer.Option(None, "--errors", help="Write the error lines here (default stderr)."),
    base_url: str = BASE, api_key: str | None = KEY,
) -> None:
    """The batch's output file (and its error file), as JSONL; exit 1 if the batch has not ended."""
    client = _client(base_url, api_key)
    b = client.batches.retrieve(batch_id)
    if b.status not in DONE:
        typer.echo(f"{_line(b)}: not finished yet", err=True)
        raise typer.Exit(1)
    for file_id, dest, err in ((b.output_file_id, out, False), (b.error_file_id, errors, True)):
        if not file_id:
            continue
        text = client.files.content(file_id).text
        if dest is not None:
            dest.write_text(text)
        else:
            typer.echo(text, nl=False, err=err)
