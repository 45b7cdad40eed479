"""Offline tools: what runs before serving, never on a request's path.

Training, calibrating and evaluating the route classifier and the cascade floors (router/, behind `tokenomy router
...`), fitting the semantic cache's verifier (cache/) and the reference greedy decoder the structured-output tests
and benchmarks measure against (structured/). They import the runtime packages (tokenomy.router, tokenomy.cache,
tokenomy.structured, tokenomy.engine), which never import them back: the serving path (tokenomy.gateway,
tokenomy.pipeline, tokenomy.api, tokenomy.backends) only loads what these tools wrote.
"""
