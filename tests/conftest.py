"""Shared test configuration."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # shared helpers (gguf_fixture), whatever pytest's import mode

# Triton's interpreter must be chosen before any kernel is launched; harmless when triton is absent.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("KVBENCH_THREADS", "1")  # tiny test shapes: no thread measurement, no hand-offs
# report.html costs about as much as the run's own plots again: the tests that check it turn it on for their runs
# (tests/report/html/), the others leave it to `kvbench report`.
os.environ.setdefault("KVBENCH_REPORT", "0")
# the packed copy of every weight (AMX where it takes one, else oneDNN), not a measured plan: the same paths on every
# run; the measurement is tested on its own (tests/models/test_cpu_choices.py)
os.environ.setdefault("KVBENCH_MATMUL", "packed")
# the decode attention's prefetch as it was before it was measured; the measurement is tested on its own
# (tests/models/test_decode_prefetch.py)
os.environ.setdefault("KVBENCH_DECODE_PREFETCH", "16:L1")


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


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test session (2 CPUs, 127.0.0.1 only), started by the first test that asks,
    shut down at the end; tests skip cleanly where Ray is missing or cannot start."""
    pytest.importorskip("ray")
    from kvbench.errors import KvbenchError
    from kvbench.studies.fleet.ray_runtime import ray_session

    session = ray_session(None, num_cpus=2)
    try:
        ray = session.__enter__()
    except KvbenchError as err:
        pytest.skip(f"Ray cannot start here: {err}")
    try:
        yield ray
    finally:
        session.__exit__(None, None, None)


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
    labels = {
        "block_size": "block_size",
        "num_gpu_blocks": "num_gpu_blocks",
        "enable_prefix_caching": "enable_prefix_caching",
    }

    def build(base: str = "busy", **values) -> str:
        text = texts[base]
        for key, value in values.items():
            if key in labels:
                text, count = re.subn(
                    rf'(vllm:cache_config_info\{{[^}}]*\b{labels[key]}=")[^"]*"', rf'\g<1>{value}"', text
                )
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


@pytest.fixture()
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` module with the offline API kvbench's vLLM backend uses (LLM, SamplingParams,
    TokensPrompt, llm_engine.add_request/step, logger_manager.record, vllm_config.cache_config): a small
    continuous-batching engine over a block pool, so the adapter is tested without vLLM installed."""
    import math
    import sys
    import types

    module = types.ModuleType("vllm")
    module.__version__ = "0.0-fake"
    module.built = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    def TokensPrompt(prompt_token_ids):  # noqa: N802 (vLLM's name)
        return {"prompt_token_ids": list(prompt_token_ids)}

    class Output:
        def __init__(self, request_id, token_ids, finished, preemptions=0):
            self.request_id = request_id
            self.outputs = [
                types.SimpleNamespace(token_ids=list(token_ids), finish_reason="length" if finished else None)
            ]
            self.finished = finished
            self.metrics = types.SimpleNamespace(num_preemptions=preemptions)

    class LoggerManager:
        def __init__(self):
            self.records = 0

        def record(self, scheduler_stats=None, iteration_stats=None, mm_cache_stats=None):
            self.records += 1

    class Engine:
        def __init__(self, block_size, num_blocks, max_num_seqs, log_stats=True):
            self.vllm_config = types.SimpleNamespace(
                cache_config=types.SimpleNamespace(
                    block_size=block_size, num_gpu_blocks=num_blocks, num_cpu_blocks=None
                )
            )
            if log_stats:
                self.logger_manager = LoggerManager()
            self.block_size, self.usable, self.max_num_seqs = block_size, num_blocks - 1, max_num_seqs
            self.waiting, self.running, self.added, self.max_in_engine = [], [], [], 0

        def add_request(self, request_id, prompt, params):
            internal = f"{request_id}-0a1b2c3d"  # vLLM makes its ids unique; outputs carry the caller's id
            self.waiting.append(
                {"id": request_id, "prompt": prompt["prompt_token_ids"], "params": params, "tokens": [], "blocks": 0}
            )
            self.added.append(request_id)
            self.max_in_engine = max(self.max_in_engine, len(self.waiting) + len(self.running))
            return internal

        def has_unfinished_requests(self):
            return bool(self.waiting or self.running)

        def _held(self):
            return sum(r["blocks"] for r in self.running)

        def step(self):
            while self.waiting and len(self.running) < self.max_num_seqs:
                need = math.ceil(len(self.waiting[0]["prompt"]) / self.block_size)
                if self._held() + need > self.usable:
                    break
                request = self.waiting.pop(0)
                request["blocks"] = need
                self.running.append(request)
            outputs, finished = [], []
            for r in self.running:
                r["tokens"].append((sum(r["prompt"]) + len(r["tokens"])) % 97)
                kv = len(r["prompt"]) + len(r["tokens"]) - 1
                r["blocks"] = max(r["blocks"], math.ceil(kv / self.block_size))
                done = len(r["tokens"]) >= r["params"].max_tokens
                outputs.append(Output(r["id"], r["tokens"], done))
                if done:
                    finished.append(r)
            self.running = [r for r in self.running if r not in finished]
            manager = getattr(self, "logger_manager", None)
            if manager is not None:
                manager.record(
                    scheduler_stats=types.SimpleNamespace(
                        kv_cache_usage=self._held() / self.usable, num_running_reqs=len(self.running)
                    ),
                    iteration_stats=types.SimpleNamespace(num_preempted_reqs=0),
                )
            return outputs

    class LLM:
        bytes_per_token = 1  # set by a test to the model's, so the block count follows the KV bytes

        def __init__(self, **kwargs):
            self.kwargs = kwargs
            blocks = kwargs["kv_cache_memory_bytes"] // (kwargs["block_size"] * LLM.bytes_per_token)
            self.llm_engine = Engine(
                kwargs["block_size"],
                blocks,
                kwargs["max_num_seqs"],
                log_stats=not kwargs.get("disable_log_stats", True),
            )
            module.built.append(self)

    module.SamplingParams, module.TokensPrompt, module.LLM = SamplingParams, TokensPrompt, LLM
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """(path, source model) of a tiny random Llama written as a GGUF file with a tokenizer; skipped without the
    optional packages (``pip install 'kvbench[gguf]'``)."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from gguf_fixture import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path, seed=3)
