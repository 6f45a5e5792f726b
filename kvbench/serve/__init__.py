"""``kvbench serve``: the engines behind an OpenAI-compatible HTTP server (protocol, engine loop, app, lifecycle)."""
