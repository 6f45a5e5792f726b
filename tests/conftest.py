"""Shared test configuration."""

import os

# Triton's interpreter must be chosen before any kernel is launched; harmless when triton is absent.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests: CI (HYPOTHESIS_PROFILE=ci, set by .ci/run) replays the same examples on every run, so a
# green or red result never depends on luck; local runs ("dev", the default) keep exploring new ones.
# A failure found while exploring is kept in the test as an explicit @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Test shapes are tiny: threads only add hand-offs, and on 2 busy CI cores each can wait a time slice."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


DIAGNOSE_DATA = __import__("pathlib").Path(__file__).parent / "report" / "diagnose" / "data"


@pytest.fixture(scope="session")
def vllm_exposition():
    """``vllm_exposition(**values)``: the /metrics text recorded from a busy vLLM 0.32 CPU server with some
    values changed (usage, running, waiting, waiting_capacity, preemptions, finished, prefix_queries,
    prefix_hits, block_size, num_gpu_blocks, enable_prefix_caching); ``base`` picks idle, busy or after."""
    import re

    texts = {name: (DIAGNOSE_DATA / f"vllm_metrics_{name}.txt").read_text() for name in ("idle", "busy", "after")}
    patterns = {
        "usage": r"^(vllm:kv_cache_usage_perc\{[^}]*\}) \S+$",
        "running": r"^(vllm:num_requests_running\{[^}]*\}) \S+$",
        "waiting": r"^(vllm:num_requests_waiting\{[^}]*\}) \S+$",
        "waiting_capacity": r'^(vllm:num_requests_waiting_by_reason\{[^}]*reason="capacity"\}) \S+$',
        "preemptions": r"^(vllm:num_preemptions_total\{[^}]*\}) \S+$",
        "finished": r'^(vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\}) \S+$',
        "prefix_queries": r"^(vllm:prefix_cache_queries_total\{[^}]*\}) \S+$",
        "prefix_hits": r"^(vllm:prefix_cache_hits_total\{[^}]*\}) \S+$",
    }
    labels = {"block_size": "block_size", "num_gpu_blocks": "num_gpu_blocks",
              "enable_prefix_caching": "enable_prefix_caching"}

    def build(base: str = "busy", **values) -> str:
        text = texts[base]
        for key, value in values.items():
            if key in labels:
                text, count = re.subn(rf'(vllm:cache_config_info\{{[^}}]*\b{labels[key]}=")[^"]*"', rf'\g<1>{value}"', text)
            else:
                text, count = re.subn(patterns[key], rf"\g<1> {float(value)}", text, flags=re.MULTILINE)
            assert count >= 1, key
        return text

    return build


@pytest.fixture()
def metrics_server():
    """A fake metrics endpoint on 127.0.0.1 (never the network): ``server.serve(bodies, content_type)`` makes
    each GET answer the next body (the last one repeats); ``server.url`` is its /metrics URL."""
    import http.server
    import threading

    class Server:
        bodies: list[str] = ["# empty\n"]
        content_type = "text/plain; version=0.0.4"
        status = 200
        hits = 0

        def serve(self, bodies, content_type="text/plain; version=0.0.4", status=200):
            self.bodies, self.content_type, self.status, self.hits = list(bodies), content_type, status, 0
            return self

    state = Server()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = state.bodies[min(state.hits, len(state.bodies) - 1)].encode()
            state.hits += 1
            self.send_response(state.status)
            self.send_header("Content-Type", state.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
