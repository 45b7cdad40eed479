"""How the commands hand over a rendered report: to standard output, or to a file with a note on stderr."""

from __future__ import annotations

from pathlib import Path

import typer


def emit(text: str, out: Path | None, exit_code: int = 1) -> None:
    """Print ``text`` (adding no second newline), or write it to ``out`` and say so on stderr; a file that
    cannot be written ends the command with ``exit_code`` and one line naming why."""
    if out is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        typer.echo(f"cannot write {out}: {e}", err=True)
        raise typer.Exit(exit_code) from None
    typer.echo(f"wrote {out} ({len(text):,} bytes)", err=True)
