"""`tokenomy bench`: a load generator and serving benchmark for any OpenAI-compatible endpoint. A client only: it
imports nothing of tokenomy's server (api, pipeline, engine)."""
