"""Traces (OpenTelemetry spans in the GenAI semantic conventions), their export from a process of their own, and
OTel metrics pushed over OTLP."""
