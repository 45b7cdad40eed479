"""The base every section of the YAML file is built on, and the one error a bad file raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A mapping of the file: an unknown key is an error that names it, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


class ConfigError(ValueError):
    """A file (or a model named on the command line) that cannot be served, with what to change."""
