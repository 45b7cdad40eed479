"""The OpenAI dialect, below both of its speakers (the HTTP app in api/, the batch worker in batch/): request bodies
and the one mapping from a body to the internal `GenRequest` (schemas.py), response bodies and stream chunks
built from the pipeline's result (wire.py)."""
