"""What a model is before anything runs it: the packaged models and the hub, GGUF and config.json reading, the
model's geometry and formulas, and whether its weights and KV fit in memory (the planner and the engine both use it)."""
