"""Each API's bodies and their one mapping to and from the internal request, below both of their speakers (the HTTP
app in api/, the batch worker in batch/): OpenAI chat completions and completions (chat.py: request bodies and the
mapping to `GenRequest`; chat_wire.py: response bodies and stream chunks built from the pipeline's result), the
Responses API (responses.py, responses_wire.py), embeddings (embeddings.py) and Anthropic Messages (messages.py,
messages_wire.py)."""
