"""Every flag more than one command takes, declared once: its names, what it means, its range and its checks.
A command gives the default and may say in its own help what the value is for there; the name, the type's range,
the choices and the one-line errors stay the flag's, so ``--max-len 1`` is refused alike by every command.

    block_size: int = BLOCK_SIZE(16)                      # a command's default, the flag's help
    max_len: Annotated[int | None, MAX_LEN.annotated(panel=PANEL)] = None
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import typer

from kvbench.commands._options import COMPUTE_DTYPES, choice, completes, device_choice, positive_fraction
from kvbench.kv.policies import MANAGERS, RESERVATION_POLICIES
from kvbench.studies.run_requests import STOP_MODES


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # the long flag first, then its aliases
    help: str  # what the value means, wherever it is given
    checks: Mapping[str, Any] = field(default_factory=dict)  # typer.Option's range, metavar, callback, completion

    def __call__(self, default: Any, help: str | None = None, panel: str | None = None) -> Any:
        """The declaration for a parameter with ``default``; ``help`` says what the value is for in this command."""
        return typer.Option(default, *self.names, **self._keywords(help, panel))

    def annotated(self, help: str | None = None, panel: str | None = None) -> Any:
        """The declaration for an ``Annotated[type, ...]`` parameter, whose default is the parameter's own."""
        return typer.Option(*self.names, **self._keywords(help, panel))

    def _keywords(self, help: str | None, panel: str | None) -> dict[str, Any]:
        keywords = {**self.checks, "help": help or self.help}
        if panel is not None:
            keywords["rich_help_panel"] = panel
        return keywords


def flag(*names: str, help: str, **checks: Any) -> Flag:
    return Flag(names, help, checks)


def _gpu_presets() -> tuple[str, ...]:
    from kvbench.models.gpus import GPU_PRESETS

    return tuple(GPU_PRESETS)


# what is run, where and how
MODEL = flag(
    "--model",
    help="Preset (random weights), local checkpoint dir / config.json / GGUF file, or a Hugging Face id (owner/name; "
    "HF_HUB_OFFLINE=1: the local cache only).",
)
DEVICE = flag("--device", help="auto: CUDA when available, else the CPU (also cuda:N).", **device_choice())
DTYPE = flag(
    "--dtype",
    help="The dtype the model computes in (auto: the checkpoint's, or fp32 on a CPU and fp16 on CUDA).",
    **choice(("auto", *COMPUTE_DTYPES), case_sensitive=False),
)
THREADS = flag("--threads", help="CPU threads for the model's matmuls: a number, or auto (measured at start).")
GPU = flag("--gpu", help="GPU preset.", **completes(_gpu_presets))
GPU_MEMORY_UTILIZATION = flag(
    "--gpu-memory-utilization",
    help="Share of GPU memory the engine may use, in [0.01, 1].",
    max=1.0,
    callback=positive_fraction,
)
SEED = flag("--seed", help="Seed of everything drawn at random.", min=0)

# the KV cache
BLOCK_SIZE = flag("--block-size", help="Tokens per KV block.", min=1)
MAX_LEN = flag(
    "--max-len",
    "--max-model-len",
    help="Context limit: a request's prompt and output together at most this many tokens (contiguous-max "
    "reserves this).",
    min=2,
)
KV_MEMORY = flag("--kv-memory", help="KV memory of one instance (one GPU), e.g. 64MiB or 8GiB.")
MAX_NUM_SEQS = flag("--max-num-seqs", help="The scheduler's cap on requests running at once.", min=1)
RESERVE = flag("--reserve", help="What a contiguous request reserves.", **choice(RESERVATION_POLICIES))
PREFIX_CACHING = flag(
    "--prefix-caching/--no-prefix-caching",
    help="The paged engine's prefix cache: a prompt's leading full blocks another request computed are reused.",
)

# the requests
REQUESTS = flag("--requests", help="Requests to run.", min=1)
REPEAT = flag("--repeat", help="Times each measurement runs.", min=1)
DATASET = flag(
    "--dataset",
    help="Prompts from a ShareGPT JSON or {prompt, output_len} JSONL file, or 'real-chat' (shipped).",
)
REQUESTS_FILE = flag(
    "--requests-file",
    help="JSONL of {prompt_token_ids, output_len} (optional arrival_time, s) to replay exactly.",
)
MEAN_LEN = flag("--mean-len", help="Mean total length of a request (prompt + output), in tokens.", min=1)
OUTPUT_LEN = flag("--output-len", help="Tokens generated per request.", min=1)
CONCURRENCY = flag("--concurrency", help="Requests in flight at once (closed loop).", min=1)
RATE = flag("--rate", help="Requests (or sessions) starting per second, Poisson arrivals (open loop).")
PREFIX_GROUPS = flag("--prefix-groups", help="Synthetic prompts start with one of this many shared prefixes.", min=0)
PREFIX_LEN = flag("--prefix-len", help="Tokens of each shared prefix.", min=0)
TRACE = flag(
    "--trace",
    help="A request trace: CSV/JSONL of prompt_len + output_len (+ arrival_time, s), a hash-id trace in Mooncake's "
    "format (timestamp ms, input_length, output_length, hash_ids), or a shipped one: mooncake-conversation-1k.",
)
STOP = flag(
    "--stop",
    help="eos: answers end where the model emits EOS; length: every answer runs to its drawn length, EOS ignored.",
    **choice(STOP_MODES),
)

# servers measured over HTTP
TARGET = flag(
    "--target",
    help="An OpenAI-compatible server: [NAME=]http://HOST:PORT (repeatable; NAME labels it, default HOST:PORT).",
    metavar="[NAME=]URL",
)
METRICS_URL = flag("--metrics-url", help="A Prometheus metrics endpoint, e.g. http://127.0.0.1:8000/metrics.")
SLO = flag("--slo", help="Objectives in ms for goodput, e.g. ttft=500,tpot=50 (requests/s meeting all).")
REQUEST_TIMEOUT = flag("--request-timeout", help="Seconds one request may take; past it, it fails (timeout).")
MAX_SCRAPE_INTERVAL_S = 3600.0  # an hour between scrapes: past that, a scrape sees nothing happen
SCRAPE_INTERVAL = flag(
    "--scrape-interval",
    help="Seconds between scrapes of a server's /metrics (0.05 to 3600).",
    min=0.05,
    max=MAX_SCRAPE_INTERVAL_S,
)
KV_EVENTS = flag(
    "--kv-events",
    help="A KV event stream, as vLLM publishes it (ZMQ: a port on 127.0.0.1, tcp://HOST:PORT or ipc://PATH).",
)
KV_EVENTS_REPLAY = flag("--kv-events-replay", help="The replay socket for missed KV event batches (with --kv-events).")
ENGINE = flag("--engine", help="The KV manager of the served engine.", **choice(MANAGERS))

# fanning out and exporting
RAY = flag("--ray", help="Run the work as Ray tasks.")
RAY_ADDRESS = flag("--ray-address", help="With --ray: join this Ray cluster (HOST:PORT) instead of starting one.")
METRICS_PORT = flag(
    "--metrics-port", help="Serve live Prometheus metrics on this port (0: any free one).", min=0, max=65535
)
METRICS_FILE = flag("--metrics-file", help="Write the Prometheus exposition text here at the end.")

# what a command writes
OUT = flag("--out", help="Where the command writes.")
JSON = flag("--json", help="Print the result as JSON on stdout.")
VERBOSE = flag("--verbose", "-v", help="Print in full.")
