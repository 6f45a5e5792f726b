"""``kvbench reuse``: the prefix hit rate a trace gets for each size of KV memory, on a planned deployment."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from kvbench.commands._deployment_options import DEPLOYMENT, Deployment, deployment_fields
from kvbench.commands._flags import (
    BLOCK_SIZE,
    DATASET,
    JSON,
    MAX_LEN,
    MAX_NUM_SEQS,
    OUT,
    OUTPUT_LEN,
    PREFIX_GROUPS,
    PREFIX_LEN,
    RATE,
    REQUESTS,
    REQUESTS_FILE,
    SEED,
)
from kvbench.commands._options import (
    MIN_RATE,
    make_console,
    parse_size,
    run_directory,
)
from kvbench.commands._run import write_study
from kvbench.commands._trace_options import (
    DEFAULT_CONVENTION,
    MAX_REQUESTS,
    SHIPPED_TRACE,
    TIME_SCALE,
    TRACE,
    TRACE_BLOCK_SIZE,
    TRACE_CONVENTION,
    WINDOW,
    load_prefix_trace,
    subset,
)
from kvbench.errors import KvbenchError
from kvbench.report.reuse_report import CURVE_FILE, print_reuse, reuse_markdown, reuse_plot
from kvbench.results.run_meta import RunMeta, run_meta
from kvbench.studies.reuse import DEFAULT_POINTS, MAX_POINTS, ReuseSettings, run_reuse_study
from kvbench.workload.dataset import resolve_dataset
from kvbench.workload.prefix_trace import (
    DEFAULT_TRACE_BLOCK,
    PrefixTrace,
    session_trace,
    shared_prefix_trace,
    sharegpt_sessions,
    trace_from_prompts,
)
from kvbench.workload.requests_file import load_requests_jsonl

MAX_PREFIX_GROUPS = 100_000
MAX_TOKENS = 1_000_000  # a synthetic request's lengths and the sessions drawn: beyond, the trace does not fit memory


@DEPLOYMENT.add(settings=ReuseSettings)
def reuse(
    trace: Annotated[str | None, TRACE] = None,
    trace_block_size: Annotated[int, TRACE_BLOCK_SIZE] = DEFAULT_TRACE_BLOCK,
    convention: Annotated[str, TRACE_CONVENTION] = DEFAULT_CONVENTION,
    requests_file: Path | None = REQUESTS_FILE(
        None,
        "JSONL of prompt_token_ids + output_len (optional arrival_time, s): hashed in blocks of --block-size.",
    ),
    dataset: Path | None = DATASET(
        None, "ShareGPT JSON: each conversation a session whose turns resend its history (words as tokens)."
    ),
    prefix_groups: int = PREFIX_GROUPS(0),
    prefix_len: int = PREFIX_LEN(1024),
    suffix_len: int = typer.Option(
        256, "--suffix-len", min=1, max=1_000_000, help="Tokens of each request's own (synthetic)."
    ),
    output_len: int = OUTPUT_LEN(128, "Output tokens per request (synthetic)."),
    requests: int = REQUESTS(1000, "Sessions of the synthetic workload or of --dataset."),
    turns: int = typer.Option(1, "--turns", min=1, max=1000, help="Turns per synthetic session (history resent)."),
    think_time: float = typer.Option(
        10.0, "--think-time", help="Seconds between a session's turns (synthetic, --dataset)."
    ),
    rate: float = RATE(5.0, "Sessions starting per second (synthetic, --dataset; Poisson)."),
    seed: int = SEED(0, "Seed of the synthetic workload."),
    max_requests: Annotated[int | None, MAX_REQUESTS] = None,
    window: Annotated[str | None, WINDOW] = None,
    time_scale: Annotated[float, TIME_SCALE] = 1.0,
    block_size: int = BLOCK_SIZE(16, "The deployment's KV block size in tokens."),
    max_num_seqs: int = MAX_NUM_SEQS(256),
    max_model_len: int | None = MAX_LEN(
        None, "Context a request (prompt and output) must fit; longer ones are left out (default: the model's)."
    ),
    kv_sizes: str | None = typer.Option(
        None, "--kv-sizes", help="KV memory sizes to simulate besides the default range, e.g. 16GiB,1TiB."
    ),
    points: int = typer.Option(
        DEFAULT_POINTS,
        "--points",
        min=0,
        max=MAX_POINTS,
        help="KV sizes on the curve, the deployments among them (at least those): from 1/8 of the deployment's "
        "KV memory to 64x.",
    ),
    offload: str | None = typer.Option(
        None, "--offload", help="A CPU tier of this size behind the GPU cache (write-through, LRU), e.g. 256GiB."
    ),
    out: str | None = OUT(None, "Run directory (default reports/reuse-<time>)."),
    as_json: bool = JSON(False, "Print the summary as JSON on stdout instead of tables."),
    *,
    deployment: Deployment,
) -> None:
    """Prefix hit rate of a trace for each size of KV memory, on a planned deployment.

    The trace is --trace, by default the shipped mooncake-conversation-1k. Runs it at its arrival times through a
    paged prefix cache (vLLM's eviction: least recently freed
    first, running requests pinned) at KV sizes around the deployment's, with roofline service times, and says
    where the deployment sits, what more GPUs or a CPU tier buy, and why (reuse distances)."""
    out_dir = run_directory(out)
    given = (("--trace", trace), ("--requests-file", requests_file), ("--dataset", dataset))
    sources = [name for name, value in given if value]
    if prefix_groups:
        sources.append("--prefix-groups")
    if len(sources) > 1:
        raise KvbenchError(f"{' and '.join(sources)} each give the requests: choose one")
    if not (math.isfinite(rate) and MIN_RATE <= rate <= 1e6):  # slower, the sessions' arrivals span years
        raise KvbenchError(f"--rate must be between {MIN_RATE:g} and 1,000,000 per second, got {rate!r}")
    if not (math.isfinite(think_time) and 0 <= think_time <= 86_400):
        raise KvbenchError(f"--think-time must be 0 to 86,400 seconds, got {think_time!r}")
    limits = (
        ("--prefix-groups", prefix_groups, MAX_PREFIX_GROUPS),  # each group's prefix is drawn up front
        ("--prefix-len", prefix_len, MAX_TOKENS),
        ("--output-len", output_len, MAX_TOKENS),
        ("--requests", requests, MAX_TOKENS),
    )
    for flag, value, limit in limits:
        if value > limit:
            raise KvbenchError(f"{flag}: at most {limit:,}, got {value:,}")
    if prefix_groups and prefix_len < 1:
        raise KvbenchError("--prefix-groups shares a prefix: give --prefix-len 1 or more")
    if turns > 1 and not prefix_groups:
        raise KvbenchError("--turns shapes the synthetic workload: give --prefix-groups too")
    settings = ReuseSettings(
        **deployment_fields(deployment, ReuseSettings),
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        kv_sizes=tuple(parse_size(part, "--kv-sizes") for part in kv_sizes.split(",")) if kv_sizes else (),
        points=points,
        offload_bytes=parse_size(offload, "--offload") if offload is not None else 0,
        max_model_len=max_model_len,
    )
    console = make_console(stderr=as_json)
    if requests_file is not None:
        workload = _requests_file_trace(requests_file, block_size)
    elif dataset is not None:
        sessions = sharegpt_sessions(resolve_dataset(dataset), requests)
        workload = session_trace(sessions, rate, think_time, seed, block_size, str(dataset))
    elif prefix_groups:
        workload = shared_prefix_trace(
            prefix_groups, requests, prefix_len, suffix_len, output_len, rate, seed, block_size, turns, think_time
        )
    else:
        workload = load_prefix_trace(trace or SHIPPED_TRACE, trace_block_size, convention, None, None, 1.0)
    workload = subset(workload, max_requests, window, time_scale)
    with console.status("simulating...") as status:
        found = run_reuse_study(workload, settings, status.update)
    meta = RunMeta.from_json(
        run_meta(
            model_name=found.deployment.model_name,
            gpu=settings.gpu,
            tensor_parallel_size=deployment.tensor_parallel,
            pipeline_parallel_size=deployment.pipeline_parallel,
            kv_cache_dtype=deployment.kv_cache_dtype,
            block_size=block_size,
            time_scale=time_scale,
            window=window,
            max_requests=max_requests,
            simulated=True,
        )
    )
    curve = replace(found, meta=meta)
    write_study(
        "reuse",
        out_dir,
        curve,
        as_json,
        plot=reuse_plot,
        plot_file=CURVE_FILE,
        markdown=reuse_markdown,
        tables=lambda run_dir: print_reuse(console, curve, run_dir),
    )


def _requests_file_trace(path: Path, block_size: int) -> PrefixTrace:
    """A requests file as a trace: its rows' arrival_time (s) where given, else all at once."""
    from kvbench.json_input import loads
    from kvbench.workload.jsonl import read_text

    items = load_requests_jsonl(path)
    arrivals = []
    for line in read_text(path, "requests file").splitlines():
        if line.strip():
            value = loads(line).get("arrival_time", 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise KvbenchError(f"{path}: arrival_time must be a non-negative number of seconds, got {value!r}")
            arrivals.append(float(value))
    prompts = [(arrival, ids, out, None) for arrival, (ids, out) in zip(arrivals, items, strict=True)]
    return trace_from_prompts(prompts, block_size, str(path))


def register(app: typer.Typer) -> None:
    app.command("reuse")(reuse)
