"""``sweep --target [NAME=]URL`` and its options, declared once: servers over HTTP as the sweep's engines.

``@TARGETS.add()`` (:mod:`kvbench.commands._option_group`) adds them to a command's signature (help panel
"Servers over HTTP") and hands the command one parsed :class:`~kvbench.studies.run_options.EndpointOptions` (None
without ``--target``) as its ``endpoint`` argument. Each option's type and default are a field's of
``EndpointOptions``, or of :class:`TargetArgs` where the command line gives the value in another form (text parsed
here). Every value is checked here, with one-line errors naming the flag.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlsplit

import typer

from kvbench.commands._flags import (
    MAX_LEN,
    METRICS_URL,
    OUTPUT_LEN,
    RATE,
    REQUEST_TIMEOUT,
    SCRAPE_INTERVAL,
    SLO,
    TARGET,
)
from kvbench.commands._kv_event_options import KV_EVENTS, KV_EVENTS_BIND, KV_EVENTS_REPLAY, listening
from kvbench.commands._option_group import OptionGroup, SharedOption, flag_name, from_settings
from kvbench.commands._options import MIN_RATE, choice
from kvbench.commands._trace_options import (
    DEFAULT_CONVENTION,
    MAX_REQUESTS,
    TIME_SCALE,
    TRACE,
    TRACE_BLOCK_SIZE,
    TRACE_CONVENTION,
    WINDOW,
    in_panel,
    load_prefix_trace,
)
from kvbench.endpoint.client import Target
from kvbench.endpoint.client_metrics import parse_slo
from kvbench.endpoint.openai import APIS
from kvbench.errors import KvbenchError
from kvbench.studies.run_options import EndpointOptions
from kvbench.workload.lengths import TokenRange
from kvbench.workload.prefix_trace import DEFAULT_TRACE_BLOCK

PANEL = "Servers over HTTP (--target)"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class TargetArgs:
    """The ``--target`` options :class:`EndpointOptions` holds in another form, as the command line gives them."""

    target: list[str] | None = None  # [NAME=]URL, a server each
    api: str = "completions"
    model_name: str | None = None
    api_key_env: str | None = None
    metrics_url: str | None = None
    input_len: str | None = None  # N or LO:HI
    output_len: str | None = None
    slo: str | None = None  # KEY=MS pairs
    rate: str | None = None  # comma-separated requests per second
    no_scrape: bool = False
    kv_events: str | None = None
    kv_events_bind: bool = False
    kv_events_replay: str | None = None
    trace: str | None = None  # a file or a shipped trace's name
    trace_block_size: int = DEFAULT_TRACE_BLOCK
    trace_convention: str = DEFAULT_CONVENTION
    max_requests: int | None = None
    window: str | None = None  # START:END seconds
    time_scale: float = 1.0


# each option's type and default are TargetArgs' where the command line gives another form, else EndpointOptions'
TARGET_OPTIONS: tuple[SharedOption, ...] = from_settings(
    (TargetArgs, EndpointOptions),
    {
        "target": TARGET.annotated(
            "An OpenAI-compatible server to benchmark instead of the in-process engines: [NAME=]http://HOST:PORT "
            "(repeatable; NAME labels its column, default HOST:PORT).",
            PANEL,
        ),
        "api": typer.Option(
            "--api",
            rich_help_panel=PANEL,
            help="The API the load uses: /v1/completions or /v1/chat/completions.",
            **choice(tuple(APIS)),
        ),
        "model_name": typer.Option(
            "--model-name",
            rich_help_panel=PANEL,
            help="The model name requests carry (default: the first one /v1/models lists).",
        ),
        "api_key_env": typer.Option(
            "--api-key-env",
            rich_help_panel=PANEL,
            help="Environment variable holding the API key (sent only over https or to loopback; default: none).",
        ),
        "metrics_url": METRICS_URL.annotated(
            "Where the server's Prometheus metrics are (default: URL/metrics); one target only.", PANEL
        ),
        "point_timeout_s": typer.Option(
            "--point-timeout",
            metavar="SECONDS",
            rich_help_panel=PANEL,
            help="Stop each point after this long: requests in flight are cancelled and the rest not sent, each "
            "recorded as such, and the point is marked stopped at its time limit (default: none).",
        ),
        "input_len": typer.Option(
            "--input-len",
            metavar="N|LO:HI",
            rich_help_panel=PANEL,
            help="Each prompt's length in tokens, fixed or drawn uniformly from LO:HI (vllm bench serve's "
            "--random-input-len; default: the scenario's lengths).",
        ),
        "output_len": OUTPUT_LEN.annotated(
            "Each answer's length asked for (max_tokens): N, or LO:HI drawn (vllm bench serve's --random-output-len).",
            PANEL,
        ),
        "max_len": MAX_LEN.annotated(
            "Prompt and answer together at most this many tokens: the served model's context (default: the "
            "scenario's max-len).",
            PANEL,
        ),
        "slo": SLO.annotated("Objectives in ms for goodput and --find-max, e.g. ttft=500,tpot=50.", PANEL),
        "slo_attainment": typer.Option(
            "--slo-attainment",
            min=0.0,
            max=1.0,
            rich_help_panel=PANEL,
            help="Share of requests that must meet every objective for a point to meet the SLO.",
        ),
        "rate": RATE.annotated(
            "Open loop instead of --concurrency: comma-separated request rates (req/s), Poisson arrivals.", PANEL
        ),
        "burstiness": typer.Option(
            "--burstiness",
            rich_help_panel=PANEL,
            help="With --rate: the gamma shape of the gaps between arrivals (1: Poisson; <1 burstier), as vLLM's.",
        ),
        "max_concurrency": typer.Option(
            "--max-concurrency", min=1, rich_help_panel=PANEL, help="With --rate: the most requests in flight."
        ),
        "request_timeout_s": REQUEST_TIMEOUT.annotated(panel=PANEL),
        "scrape_interval_s": SCRAPE_INTERVAL.annotated(panel=PANEL),
        "no_scrape": typer.Option(
            "--no-scrape", rich_help_panel=PANEL, help="Do not read the server's /metrics (client figures only)."
        ),
        "reset_prefix_cache": typer.Option(
            "--reset-prefix-cache",
            rich_help_panel=PANEL,
            help="Empty the server's prefix cache before each point (vLLM needs VLLM_SERVER_DEV_MODE=1); each point "
            "says whether it was.",
        ),
        "kv_events": in_panel(KV_EVENTS, PANEL),
        "kv_events_bind": in_panel(KV_EVENTS_BIND, PANEL),
        "kv_events_replay": in_panel(KV_EVENTS_REPLAY, PANEL),
        "prefix_hit_rate": typer.Option(
            "--prefix-hit-rate",
            min=0.0,
            max=1.0,
            rich_help_panel=PANEL,
            help="Reshape each prompt so this share of its tokens opens with one shared sequence, stored by a "
            "prewarm request after any --reset-prefix-cache: a workload with this hit rate; the achieved rate is "
            "reported beside it (completions API, token-id prompts).",
        ),
        "trace": in_panel(TRACE, PANEL),
        "trace_block_size": in_panel(TRACE_BLOCK_SIZE, PANEL),
        "trace_convention": in_panel(TRACE_CONVENTION, PANEL),
        "max_requests": in_panel(MAX_REQUESTS, PANEL),
        "window": in_panel(WINDOW, PANEL),
        "time_scale": in_panel(TIME_SCALE, PANEL),
        "thrash_window_s": typer.Option(
            "--thrash-window",
            rich_help_panel=PANEL,
            help="Seconds: a block stored again this soon after the server removed it counts as thrash.",
        ),
        "find_max": typer.Option(
            "--find-max",
            rich_help_panel=PANEL,
            help="Bisect between the lowest and highest level for the highest one meeting --slo, and say what "
            "limits the server there.",
        ),
        "find_max_points": typer.Option(
            "--find-max-points",
            min=2,
            max=32,
            rich_help_panel=PANEL,
            help="The most points --find-max measures per target.",
        ),
    },
)
ARGS = frozenset(f.name for f in fields(TargetArgs))  # the options given in TargetArgs' form
TRACE_SHAPING = tuple(flag_name(o) for o in (TRACE_BLOCK_SIZE, TRACE_CONVENTION, MAX_REQUESTS, WINDOW, TIME_SCALE))


def parse_target(text: str) -> Target:
    """``NAME=URL`` or ``URL`` as a :class:`Target` (its name defaults to HOST:PORT)."""
    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        name, url = "", text
    url = url.strip()
    shown = re.sub(r"//[^/@]*@", "//***@", text)  # a user:password in the URL is never echoed
    try:
        parts = urlsplit(url)
    except ValueError:
        raise KvbenchError(f"--target {shown!r}: not a URL; expected [NAME=]http://HOST:PORT") from None
    try:
        port = parts.port
    except ValueError:
        raise KvbenchError(f"--target {shown!r}: the port must be a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise KvbenchError(f"--target {shown!r}: expected [NAME=]http://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        raise KvbenchError(
            f"--target {shown!r}: a user or password in the URL would be written into results and errors; "
            "name an environment variable holding an API key with --api-key-env instead"
        )
    host = parts.hostname if ":" not in parts.hostname else "ip6-" + parts.hostname.replace(":", "-")
    name = name.strip() or (f"{host}:{port}" if port is not None else host)
    if not NAME_PATTERN.fullmatch(name):
        raise KvbenchError(f"--target name {name!r}: use letters, digits and . _ : - (at most 64)")
    return Target(url, name=name)


def _positive(value: float, flag: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise KvbenchError(f"{flag} must be a positive number, got {value:g}")
    return value


def rate_list(text: str) -> tuple[float, ...]:
    rates: list[float] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            value = float(item)
        except ValueError:
            raise KvbenchError(f"--rate: {item!r} is not a number of requests per second") from None
        _positive(value, "--rate")
        if value < MIN_RATE:
            raise KvbenchError(
                f"--rate {item}: below {MIN_RATE:g} requests per second (one every {1 / MIN_RATE / 60:.0f} minutes) "
                "a point would wait days for its arrivals; raise the rate"
            )
        if value in rates:
            raise KvbenchError(f"--rate lists {item} twice; give each rate once")
        rates.append(value)
    if not rates:
        raise KvbenchError("--rate is empty; give comma-separated requests per second, e.g. 1,2,4")
    return tuple(rates)


def parse_target_options(values: dict[str, Any], concurrency_given: bool) -> EndpointOptions | None:
    """The options as typed, checked; None without ``--target`` (then every other target option is refused)."""
    changed = [o.flag for o in TARGET_OPTIONS if o.flag != TARGET.names[0] and values[o.name] != o.default]
    given = TargetArgs(**{name: value for name, value in values.items() if name in ARGS})
    asked = EndpointOptions(targets=(), **{name: value for name, value in values.items() if name not in ARGS})
    if not given.target:
        if changed:
            verb = "goes" if len(changed) == 1 else "go"
            raise KvbenchError(f"{', '.join(changed)} {verb} with --target (a server over HTTP)")
        return None
    key_env = given.api_key_env
    if key_env is not None and not ENV_PATTERN.fullmatch(key_env):
        raise KvbenchError(f"--api-key-env {key_env!r}: give the NAME of an environment variable, not the key")
    if key_env is not None and not os.environ.get(key_env, "").strip():
        raise KvbenchError(
            f"--api-key-env {key_env}: {key_env} is not set or empty, so no key would be sent; export it first"
        )
    targets = []
    for text in given.target:
        target = parse_target(text)
        targets.append(
            Target(
                target.url,
                api=given.api,
                model=given.model_name,
                api_key_env=key_env,
                metrics_url=given.metrics_url,
                name=target.name,
            )
        )
    names = [str(t.name) for t in targets]  # parse_target names every target
    if len(set(names)) != len(names):
        raise KvbenchError(f"--target names must differ: {', '.join(names)} (label them NAME=URL)")
    if given.metrics_url is not None and len(targets) > 1:
        raise KvbenchError("--metrics-url names one server's metrics: give it with one --target only")
    listen = listening(given.kv_events, given.kv_events_replay, given.kv_events_bind)
    if listen is not None and len(targets) > 1:
        raise KvbenchError("--kv-events names one server's KV event stream: give it with one --target only")
    if asked.prefix_hit_rate is not None and given.api == "chat":
        raise KvbenchError("--prefix-hit-rate shapes token-id prompts: it goes with --api completions")
    if asked.prefix_hit_rate is not None and given.no_scrape:
        raise KvbenchError(
            "--prefix-hit-rate is shaped in the server's block size, read from its /metrics: drop --no-scrape"
        )
    if listen is not None:
        targets = [
            replace(targets[0], kv_events=listen.endpoint, kv_events_replay=listen.replay, kv_events_bind=listen.bind)
        ]
    rates = rate_list(given.rate) if given.rate is not None else None
    trace = None
    if given.trace is not None:
        if rates is not None:
            raise KvbenchError("--trace brings its own arrival times: replay it as recorded, or with --concurrency")
        if asked.prefix_hit_rate is not None:
            raise KvbenchError("--trace and --prefix-hit-rate each shape the prompts: choose one")
        trace = load_prefix_trace(
            given.trace,
            given.trace_block_size,
            given.trace_convention,
            given.max_requests,
            given.window,
            given.time_scale,
        )
        if not trace.requests:
            raise KvbenchError(f"--trace {given.trace}: no request is left to replay")
    elif shaping := [flag for flag in changed if flag in TRACE_SHAPING]:
        raise KvbenchError(f"{', '.join(shaping)} shape a --trace: give one")
    if rates is not None and concurrency_given:
        raise KvbenchError("--rate (open loop) and --concurrency (closed loop) are two kinds of level: choose one")
    if rates is None and (asked.burstiness != EndpointOptions.burstiness or asked.max_concurrency is not None):
        raise KvbenchError("--burstiness and --max-concurrency shape the open loop: they go with --rate")
    slo = parse_slo(given.slo) if given.slo is not None else None
    if asked.find_max and slo is None:
        raise KvbenchError("--find-max looks for the highest load meeting an SLO: give --slo, e.g. ttft=500,tpot=50")
    return replace(
        asked,
        targets=tuple(targets),
        rates=rates,
        burstiness=_positive(asked.burstiness, "--burstiness"),
        slo=slo,
        request_timeout_s=_positive(asked.request_timeout_s, "--request-timeout"),
        point_timeout_s=(
            _positive(asked.point_timeout_s, "--point-timeout") if asked.point_timeout_s is not None else None
        ),
        scrape=not given.no_scrape,
        thrash_window_s=_positive(asked.thrash_window_s, "--thrash-window"),
        trace=trace,
        trace_timed=trace is not None and not concurrency_given,
        input_len=TokenRange.parse(given.input_len, "--input-len") if given.input_len else None,
        output_len=TokenRange.parse(given.output_len, "--output-len") if given.output_len else None,
    )


TARGETS = OptionGroup(
    TARGET_OPTIONS,
    "endpoint",
    lambda values, others: parse_target_options(values, others.get("concurrency") is not None),
    before_keywords=True,
)
