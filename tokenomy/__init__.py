"""tokenomy: serve LLMs so the same hardware yields more useful tokens."""

__version__ = "0.1.0"
