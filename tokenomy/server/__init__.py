"""`tokenomy serve`: the process (uvicorn over the HTTP app) and, with `server.workers: N`, its worker processes."""
