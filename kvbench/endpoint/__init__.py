"""Load on an OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``), timed from its stream,
with the server's ``/metrics`` scraped beside it: the engine-independent core of benchmarking an endpoint.

``sse`` decodes event streams, ``openai`` speaks the API, ``client`` sends and times one request,
``conversation`` and ``workloads`` say what is sent, ``load`` releases it (closed or open loop), ``record`` is
the outcome of one request, ``tokens`` fills in counts a server left out, ``metrics`` computes the client's
figures as ``vllm bench serve`` does, ``scraper`` / ``server_metrics`` / ``cache_reset`` read the server's side,
``timeline`` saves both on one time axis, and ``point`` runs one point end to end.
"""
