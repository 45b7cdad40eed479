"""Prometheus metrics: tokenomy's families by layer, the engines' families in vLLM's names, and the dashboard's live
view."""
