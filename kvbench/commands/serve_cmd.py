"""``kvbench serve``: one engine behind an OpenAI-compatible HTTP server with live Prometheus metrics."""

from __future__ import annotations

import asyncio
import math
from typing import TypeVar

import typer

from kvbench.commands._flags import ENGINE, KV_EVENTS, KV_EVENTS_REPLAY, MAX_LEN, MAX_NUM_SEQS, PREFIX_CACHING, THREADS
from kvbench.commands._options import make_console, thread_count
from kvbench.commands._run_options import MODEL_PANEL, RUN_OPTIONS
from kvbench.errors import KvbenchError
from kvbench.kv.factory import manager_class
from kvbench.kv.policies import MANAGERS, check_choice
from kvbench.studies.run_options import RunOptions
from kvbench.values import printable

LOOPBACK = ("127.0.0.1", "localhost", "::1")
T = TypeVar("T")


@RUN_OPTIONS.add(
    defaults={"block_size": 16, "reserve": "max", "admission": "queue", "seed": 0},
    helps={
        "model": "Preset (random weights: token-id prompts only), local checkpoint dir or GGUF file (text and chat).",
        "seed": "Seed of a preset's random weights.",
        "kv_memory": "KV pool size, e.g. 64MiB (default: on a CPU a quarter of the memory available, at most 4GiB; "
        "on a GPU the article scenario's budget).",
        "utilization": "On CUDA: size the pool like vLLM from real free memory.",
        "block_size": "Tokens per KV block.",
        "reserve": "What a contiguous request reserves.",
        "admission": "Contiguous when the pool is full: requests wait (queue) or get a 503 at once (reject).",
    },
    panels={"seed": MODEL_PANEL},
    without=("scenario", "requests", "requests_file", "dataset", "simulate", "gpu"),
)
def serve(
    engine: str = ENGINE("paged"),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind (loopback by default; another one is reachable from elsewhere)."
    ),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    served_model_name: str | None = typer.Option(
        None,
        "--served-model-name",
        help="The model name clients send and /v1/models lists (default: --model as given).",
    ),
    max_num_seqs: int = MAX_NUM_SEQS(256),
    max_len: int | None = MAX_LEN(
        None, "Prompt + output tokens of one request (default 2048, or the model's context if shorter)."
    ),
    threads: str = THREADS("auto"),
    grace_period: float = typer.Option(
        30.0,
        "--grace-period",
        help="Seconds requests in flight may still run after SIGTERM / Ctrl-C; the rest get a 503.",
    ),
    prefix_caching: bool = PREFIX_CACHING(True),
    kv_events: str | None = KV_EVENTS(
        None,
        "Publish the prefix cache's stored and removed blocks on this ZMQ address, as vLLM's KV events (a port on "
        "127.0.0.1, tcp://HOST:PORT or ipc://PATH).",
    ),
    kv_events_replay: str | None = KV_EVENTS_REPLAY(
        None, "Answer replay requests for missed KV event batches on this ZMQ address (with --kv-events)."
    ),
    metrics: bool = typer.Option(
        True, "--metrics/--no-metrics", help="Serve kvbench's Prometheus metrics on /metrics."
    ),
    log_interval: float = typer.Option(
        10.0, "--log-interval", help="Seconds between progress lines while busy (0: none)."
    ),
    *,
    run: RunOptions,
) -> None:
    """Serve one engine over the OpenAI API, with live Prometheus metrics.

    Serve one engine (paged or contiguous) over the OpenAI API: /v1/completions, /v1/chat/completions
    (streaming too), /v1/models, /health and /metrics (the series of `sweep --metrics-port`).

    Continuous batching: a request joins the running batch at the next engine step; a client that disconnects
    frees its KV blocks at once. When the pool is full requests wait, or with the contiguous engine and
    --admission reject are refused with 503. SIGTERM or Ctrl-C stops admitting, lets requests in flight finish
    for --grace-period seconds, answers the rest with 503 and exits 0 once every KV block is back in the pool.
    """
    from kvbench.serve.settings import ServeOptions

    if not (math.isfinite(grace_period) and grace_period >= 0):
        raise KvbenchError(f"--grace-period must be a non-negative number of seconds, got {grace_period:g}")
    if not (math.isfinite(log_interval) and log_interval >= 0):
        raise KvbenchError(f"--log-interval must be a non-negative number of seconds, got {log_interval:g}")
    if not host.strip():
        raise KvbenchError("--host is empty; give an address such as 127.0.0.1")
    if served_model_name is not None and not served_model_name.strip():
        raise KvbenchError("--served-model-name is empty")
    if not manager_class(engine).reserves_up_front and (run.admission != "queue" or run.reserve != "max"):
        raise KvbenchError(
            "--admission and --reserve set the contiguous engine's reservation; the paged engine "
            "always queues (it preempts instead of reserving)"
        )
    caching = prefix_caching and manager_class(engine).supports_prefix_caching
    if kv_events_replay is not None and kv_events is None:
        raise KvbenchError("--kv-events-replay replays the stream of --kv-events: give that address too")
    if kv_events is not None and not caching:
        raise KvbenchError(
            "--kv-events publishes the prefix cache's blocks: it needs the paged engine with --prefix-caching"
        )
    options = ServeOptions(
        model=run.model,
        engine=check_choice(engine, MANAGERS, "--engine"),
        device=run.device,
        dtype=run.dtype,
        kv_memory_bytes=run.kv_memory_bytes,
        kv_memory_text=run.kv_memory_text,
        utilization=run.utilization,
        block_size=_given(run.block_size),
        reserve=_given(run.reserve),
        admission=_given(run.admission),
        max_num_seqs=max_num_seqs,
        max_len=max_len,
        threads=thread_count(threads),
        seed=_given(run.seed),
        served_model_name=served_model_name,
        prefix_caching=caching,
        kv_events=_zmq_address(kv_events, "--kv-events"),
        kv_events_replay=_zmq_address(kv_events_replay, "--kv-events-replay"),
    )
    if options.kv_events is not None and options.kv_events == options.kv_events_replay:
        raise KvbenchError("--kv-events and --kv-events-replay name the same address")
    _serve(options, host, port, grace_period, metrics, log_interval)


def _given(value: T | None) -> T:
    """A shared option to which serve gives a default of its own: never unset here."""
    assert value is not None
    return value


def _zmq_address(text: str | None, flag: str) -> str | None:
    from kvbench.measure.kv_events import parse_endpoint

    if text is None:
        return None
    try:
        return parse_endpoint(text, bind=True)
    except ValueError as err:
        raise KvbenchError(f"{flag}: {err}") from None


def exposed_event_addresses(options) -> list[tuple[str, str]]:
    """The KV event addresses the server would bind beyond loopback, by flag."""
    exposed = []
    for flag, address in (("--kv-events", options.kv_events), ("--kv-events-replay", options.kv_events_replay)):
        host = (address or "").removeprefix("tcp://").rpartition(":")[0].strip("[]")
        if address and address.startswith("tcp://") and host not in LOOPBACK:
            exposed.append((flag, address))
    return exposed


def _serve(options, host: str, port: int, grace_s: float, with_metrics: bool, log_interval: float) -> None:
    from kvbench.serve.app import log_to_stderr
    from kvbench.serve.lifecycle import Server, check_listenable, serve_until_signalled

    console = make_console(stderr=True)
    check_listenable(host, port)  # an address this machine lacks fails here, not after the model loads
    if host not in LOOPBACK:
        console.print(
            f"[yellow]warning: --host {host} makes the server reachable from other machines; it has no "
            "authentication[/yellow]"
        )
    for flag, address in exposed_event_addresses(options):
        console.print(f"[yellow]warning: {flag} {address} is reachable from other machines[/yellow]")
    status = console.status("starting the engine process...")
    server = Server(options, host, port, with_metrics, status.update)

    def ready(running: Server) -> None:
        status.stop()
        facts, model = running.info.facts, running.info.model
        tokenizer = (
            "text, chat and token-id prompts"
            if model.has_chat_template
            else (
                "text and token-id prompts"
                if model.tokenizer is not None
                else "token-id prompts only (a preset has no tokenizer)"
            )
        )
        console.print(
            f"engine {facts.engine} on {facts.device_name} (engine process {facts.pid}); model {printable(model.name)} "
            f"({tokenizer}); max-len {model.max_len}"
        )
        console.print(
            f"KV pool: {facts.budget_source}; {facts.num_blocks:,} blocks of {facts.block_size}"
            + (
                f"; reserve {facts.reserve}, admission {facts.admission}"
                if manager_class(facts.engine).reserves_up_front
                else ""
            )
        )
        if facts.threads:
            console.print(f"CPU threads: {facts.threads.threads} ({facts.threads.reason})")
        if facts.heap:
            console.print(facts.heap)
        if facts.kv_events:
            replay = f"; replay on {facts.kv_events_replay}" if facts.kv_events_replay else ""
            console.print(f"KV events on {facts.kv_events}{replay}")
        console.print(
            f"[bold]serving on {running.url}[/bold]  (OpenAI API under /v1; /health"
            + ("; /metrics" if with_metrics else "")
            + "); Ctrl-C to stop"
        )

    log_to_stderr()
    status.start()
    try:
        report = asyncio.run(serve_until_signalled(server, grace_s, ready, log_interval))
    finally:
        status.stop()
    console.print(
        f"stopped: {report.finished_in_grace} request(s) finished in the grace period, "
        f"{report.aborted} withdrawn with a 503; every KV block is back in the pool"
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
