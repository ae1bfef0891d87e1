"""Metrics: the router's own Prometheus series (their one declaration, the registry, the
generated docs, the multi-worker view) and the local replicas' (scraping and parsing
vLLM's ``/metrics``).
"""
