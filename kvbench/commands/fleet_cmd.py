"""``kvbench fleet``: several engine instances behind a router, every routing policy on the same arrivals."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import typer

from kvbench.commands._flags import (
    ENGINE,
    JSON,
    KV_EVENTS,
    METRICS_FILE,
    METRICS_PORT,
    OUT,
    PREFIX_CACHING,
    PREFIX_GROUPS,
    PREFIX_LEN,
    RATE,
    RAY,
    RAY_ADDRESS,
    REQUEST_TIMEOUT,
    SCRAPE_INTERVAL,
    SLO,
    TARGET,
    TRACE,
)
from kvbench.commands._kv_event_options import listening
from kvbench.commands._options import (
    choice_list,
    help_panels,
    make_console,
    name_list,
    run_directory,
    writable_file,
)
from kvbench.commands._run import Run, show
from kvbench.commands._run_options import RUN_OPTIONS
from kvbench.commands._target_options import parse_target
from kvbench.endpoint.client import RequestLimits
from kvbench.endpoint.client_metrics import parse_slo
from kvbench.errors import KvbenchError, RunFailed
from kvbench.kv.policies import MANAGERS, check_choice
from kvbench.measure.exporter import FleetMetrics
from kvbench.report.fleet_report import (
    deaths,
    fleet_table,
    fleet_verdict,
    instance_table,
    simulator_table,
    write_outputs,
)
from kvbench.report.rundir import wrote_line
from kvbench.results.fleet_meta import FleetMeta
from kvbench.results.fleet_point import FleetPoint
from kvbench.studies.fleet.core import AutoscaleSettings
from kvbench.studies.fleet.ray_runtime import prepare_ray
from kvbench.studies.fleet.routing import DEFAULT_POLICIES, POLICIES, KvWeights, needs_kv_events
from kvbench.studies.run_options import RunOptions, ServerOptions, run_fields

HELP = """Several instances behind a router: every routing policy on the same arrivals.

Run N engine instances behind a router, fed by one open-loop arrival process (Poisson at --rate
req/s, or the arrival times of a --trace / --requests-file; a --dataset, or a scenario's dataset, gives the
prompts and arrives at --rate), and compare routing policies side by side on the same arrivals: round-robin, random
(seeded), least-requests, most-free-blocks (the most free KV blocks, net of
queued prefills), prefix-affinity (a prompt prefix sticks to one instance, within a load cap), and two KV-aware
ones that weigh the prompt blocks an instance already holds against its load (--prefix-weight, --load-weight):
approx-prefix (where the router sent them, remembered for --prefix-ttl seconds) and precise-prefix (what each
instance's KV events say it holds).

--target NAME=URL (repeated) routes to servers you run instead (vLLM, SGLang, kvbench serve: any
OpenAI-compatible one): each request goes where the policy says, from each server's /metrics scraped every
--scrape-interval, the router's own count of what it sent, and (--kv-events NAME=ADDRESS) each server's KV events.
Prefix caches are reset between policies; a server that dies is marked, the run goes on without it and ends with
exit 1. The same arrivals then run through the simulator with the servers' KV pools and step times fitted to the
run (simulator-check.json), to show how far the simulator is from the real fleet.

Instances are the tensor engine as Ray actors (ray.init() starts a local cluster on 127.0.0.1; --ray-address
joins one; one GPU per actor with --device cuda, else one CPU thread each), or with --simulate the tensor-free
simulator with a GPU preset on a virtual clock (8 to 256 instances in seconds). --autoscale adds an instance
when fleet block usage stays above --scale-up for --scale-window seconds and drains one below --scale-down.

Writes results.jsonl (a point per policy as it finishes), summary.json/csv/md, fleet-<policy>.json (series),
and plots: block usage per instance over time, the TTFT CDF, instances over time. `kvbench diagnose` reads it.
"""


def _positive(value: float | None, option: str) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise KvbenchError(f"{option} must be a positive number, got {value:g}")
    return value


@RUN_OPTIONS.add(
    defaults={"device": "cpu"},
    helps={
        "device": "cpu | cuda (each actor's device).",
        "seed": "Seed of lengths, prompts, arrivals and the random policy.",
        "kv_memory": "KV pool per instance, e.g. 64MiB (default: the scenario's budget).",
        "utilization": "--simulate: KV budget as vLLM sizes it.",
        "requests_file": "JSONL of prompt_token_ids + output_len (+ arrival_time).",
        "dataset": "Prompts from a ShareGPT JSON or {prompt, output_len} JSONL file (or 'real-chat', shipped; "
        "default: the "
        "scenario's dataset, if any), each run to its reference answer's length; arrivals Poisson at --rate.",
        "simulate": "Tensor-free simulator instances with a GPU preset, virtual clock.",
    },
)
@help_panels(
    {
        "Fleet": ("instances", "policies", "engine", "prefix_weight", "load_weight", "prefix_ttl", "slo"),
        "Servers over HTTP (--target)": ("targets", "kv_events", "scrape_interval", "request_timeout"),
        "Requests": ("rate", "trace", "prefix_groups", "prefix_len"),
        "KV pool": ("prefix_caching",),
        "Autoscaling": (
            "autoscale",
            "scale_up",
            "scale_down",
            "scale_window",
            "min_instances",
            "max_instances",
            "startup",
            "tick",
        ),
        "Ray": ("ray_tasks", "ray_address", "ray_cpus"),
        "Live metrics": ("metrics_port", "metrics_file"),
    }
)
def fleet(
    instances: int | None = typer.Option(
        None, "--instances", min=1, max=1024, help="Instances to start with (default 2; with --target, one per server)."
    ),
    policies: str | None = typer.Option(
        None,
        "--policies",
        help=f"Routing policies to compare, comma-separated (default: {','.join(DEFAULT_POLICIES)}, and "
        "precise-prefix where the instances' KV events are heard: --simulate, or --kv-events for every --target).",
        **choice_list(tuple(POLICIES), "policies"),
    ),
    prefix_weight: float = typer.Option(
        KvWeights.prefix, "--prefix-weight", help="KV-aware policies: cost per prompt block the instance must prefill."
    ),
    load_weight: float = typer.Option(
        KvWeights.load, "--load-weight", help="KV-aware policies: cost per block in use or queued on the instance."
    ),
    prefix_ttl: float = typer.Option(
        KvWeights.ttl_s, "--prefix-ttl", help="approx-prefix: seconds the router counts blocks it sent as held."
    ),
    slo: str | None = SLO(None),
    targets: list[str] | None = TARGET(
        None, "A server to route to instead of kvbench's own instances: [NAME=]http://HOST:PORT (repeat for each)."
    ),
    kv_events: list[str] | None = KV_EVENTS(
        None,
        "A --target's KV event stream, [NAME=]ADDRESS (ZMQ: a port on 127.0.0.1, tcp://HOST:PORT or ipc://PATH), "
        "for precise-prefix (repeat for each server).",
    ),
    scrape_interval: float = SCRAPE_INTERVAL(
        ServerOptions.scrape_interval_s, "With --target: seconds between scrapes of each server's /metrics."
    ),
    request_timeout: float = REQUEST_TIMEOUT(
        RequestLimits.timeout_s, "With --target: seconds a request may take before it fails."
    ),
    rate: float | None = RATE(None, "Poisson arrivals, requests per second (default: the file's arrival times)."),
    engine: str = ENGINE("paged", "The KV manager of every instance."),
    trace: Path | None = TRACE(None),
    prefix_groups: int = PREFIX_GROUPS(0),
    prefix_len: int = PREFIX_LEN(0),
    prefix_caching: bool = PREFIX_CACHING(True),
    autoscale: bool = typer.Option(False, "--autoscale", help="Add and remove instances by fleet block usage."),
    scale_up: float = typer.Option(
        AutoscaleSettings.scale_up, "--scale-up", help="Add an instance above this block usage (0-1]."
    ),
    scale_down: float = typer.Option(
        AutoscaleSettings.scale_down, "--scale-down", help="Drain and remove one below this block usage."
    ),
    scale_window: float = typer.Option(
        AutoscaleSettings.window_s, "--scale-window", help="Seconds usage must stay past a threshold."
    ),
    min_instances: int = typer.Option(
        AutoscaleSettings.min_instances, "--min-instances", min=1, help="Autoscaling floor."
    ),
    max_instances: int | None = typer.Option(
        None, "--max-instances", min=1, help="Autoscaling ceiling (default 2 x --instances)."
    ),
    startup: float = typer.Option(
        20.0, "--startup-s", help="--simulate: seconds an added instance takes to start (real ones are measured)."
    ),
    tick: float | None = typer.Option(None, "--tick", help="Seconds between usage samples and autoscaling decisions."),
    ray_tasks: bool = RAY(False, "--simulate: run each policy as a Ray task."),
    ray_address: str | None = RAY_ADDRESS(
        None,
        "Join this Ray cluster (HOST:PORT) instead of starting one; with --simulate only together with --ray "
        "(refused without it). Checked before anything runs.",
    ),
    ray_cpus: int | None = typer.Option(
        None,
        "--ray-cpus",
        min=1,
        help="CPUs of the local Ray cluster (default: all); with --simulate only together with --ray.",
    ),
    out: str | None = OUT(None, "Run directory (default reports/fleet-<time>)."),
    as_json: bool = JSON(False, "Print summary.json on stdout."),
    metrics_port: int | None = METRICS_PORT(
        None, "Serve live metrics (label instance) on this port (0: any free one)."
    ),
    metrics_file: Path | None = METRICS_FILE(None),
    *,
    run: RunOptions,
) -> None:
    from kvbench.studies.fleet.fleet_setup import FleetOptions  # torch loads only when a fleet runs

    _positive(rate, "--rate")
    _positive(tick, "--tick")
    weights = _weights(prefix_weight, load_weight, prefix_ttl)
    servers = _servers(targets, kv_events, scrape_interval, request_timeout)
    if servers is not None:
        _check_servers(
            servers, instances, run, autoscale, engine, ray_tasks or ray_address is not None or ray_cpus is not None
        )
        instances = len(servers.targets)
    instances = instances if instances is not None else 2
    heard = run.simulate or (servers is not None and all(t.kv_events for t in servers.targets))
    if policies is None:
        policies = ",".join(DEFAULT_POLICIES + (("precise-prefix",) if heard else ()))
    chosen = tuple(name_list(policies, "policies", tuple(POLICIES)))
    if not heard and (unheard := [name for name in chosen if needs_kv_events(name)]):
        where = "give --kv-events for every --target" if servers is not None else "run it with --simulate"
        raise KvbenchError(f"{unheard[0]} reads each instance's KV events: {where}")
    if startup < 0 or not math.isfinite(startup):
        raise KvbenchError(f"--startup-s must be a non-negative number, got {startup:g}")
    scaling = _autoscale(instances, scale_up, scale_down, scale_window, min_instances, max_instances)
    if run.requests_file is not None and trace is not None:
        raise KvbenchError("give --requests-file or --trace, not both")
    if (prefix_groups > 0) != (prefix_len > 0):
        raise KvbenchError("--prefix-groups and --prefix-len go together: give both, or neither")
    metrics_asked = metrics_port is not None or metrics_file is not None
    if servers is not None and metrics_asked:
        raise KvbenchError("--metrics-port/--metrics-file export kvbench's own instances; servers export their own")
    if servers is None:
        _check_where(run.simulate, ray_tasks, ray_address, ray_cpus, metrics_asked)
    options = FleetOptions(
        **run_fields(run),
        engine=check_choice(engine, MANAGERS, "--engine"),
        trace=trace,
        rate=rate,
        instances=instances,
        policies=chosen,
        startup_s=startup,
        tick_s=tick,
        prefix_groups=prefix_groups,
        prefix_len=prefix_len,
        prefix_caching=prefix_caching,
        ray_address=ray_address,
        ray_cpus=ray_cpus,
        simulate_on_ray=ray_tasks,
        autoscale=scaling if autoscale else None,
        servers=servers,
        weights=weights,
        slo=parse_slo(slo) if slo is not None else None,
    )
    _run(options, run_directory(out), as_json, metrics_port, writable_file(metrics_file, "--metrics-file"))


def _weights(prefix: float, load: float, ttl: float) -> KvWeights:
    for value, option in ((prefix, "--prefix-weight"), (load, "--load-weight")):
        if not (math.isfinite(value) and value >= 0):
            raise KvbenchError(f"{option} must be a non-negative number, got {value:g}")
    if prefix == 0 and load == 0:
        raise KvbenchError("--prefix-weight and --load-weight are both 0: the KV-aware policies would weigh nothing")
    _positive(ttl, "--prefix-ttl")
    return KvWeights(prefix, load, ttl)


def _servers(
    targets: list[str] | None, kv_events: list[str] | None, interval: float, timeout: float
) -> ServerOptions | None:
    """The --target servers with their event streams, checked; None without --target."""
    if not targets:
        if kv_events:
            raise KvbenchError("--kv-events names a --target's KV event stream: give the servers with --target")
        return None
    parsed = [parse_target(text) for text in targets]
    names = [str(t.name) for t in parsed]
    if len(set(names)) != len(names):
        raise KvbenchError(f"--target names must differ: {', '.join(names)} (label them NAME=URL)")
    streams: dict[str, str] = {}
    for text in kv_events or []:
        name, sep, address = text.partition("=")
        if not sep or "://" in name:  # a bare address: the one server's
            if len(parsed) > 1:
                raise KvbenchError(f"--kv-events {text!r}: name its server, NAME=ADDRESS, with several --target")
            name, address = names[0], text
        if name not in names:
            raise KvbenchError(f"--kv-events {text!r}: no --target is named {name!r} (names: {', '.join(names)})")
        if name in streams:
            raise KvbenchError(f"--kv-events names {name!r} twice")
        listen = listening(address, None, False)
        assert listen is not None
        streams[name] = listen.endpoint
    _positive(interval, "--scrape-interval")
    _positive(timeout, "--request-timeout")
    return ServerOptions(
        tuple(replace(t, kv_events=streams.get(str(t.name))) for t in parsed),
        interval,
        RequestLimits(timeout_s=timeout),
    )


def _check_servers(
    servers: ServerOptions, instances: int | None, run: RunOptions, autoscale: bool, engine: str, ray: bool
) -> None:
    """What a fleet of servers cannot take: the servers are what they are."""
    given = len(servers.targets)
    if instances is not None and instances != given:
        raise KvbenchError(f"--instances {instances} with {given} --target: the servers are the instances")
    for asked, flag in (
        (run.simulate, "--simulate"),
        (autoscale, "--autoscale"),
        (ray, "--ray/--ray-address/--ray-cpus"),
        (run.kv_memory is not None, "--kv-memory"),
        (run.device not in ("cpu", "auto"), "--device"),
        (engine != "paged", "--engine"),
    ):
        if asked:
            raise KvbenchError(f"{flag} sets up kvbench's own instances; with --target the servers are already set up")


def _autoscale(
    instances: int, scale_up: float, scale_down: float, window: float, min_instances: int, max_instances: int | None
) -> AutoscaleSettings:
    """The autoscaler's settings, checked (whether or not --autoscale is on: a bad value is refused either way)."""
    _positive(window, "--scale-window")
    for value, option in ((scale_up, "--scale-up"), (scale_down, "--scale-down")):
        if not (math.isfinite(value) and 0 < value <= 1):
            raise KvbenchError(f"{option} must be in (0, 1], got {value:g}")
    if scale_down >= scale_up:
        raise KvbenchError(f"--scale-down ({scale_down:g}) must be below --scale-up ({scale_up:g})")
    max_instances = max_instances if max_instances is not None else max(2 * instances, min_instances)
    if min_instances > max_instances:
        raise KvbenchError(f"--min-instances ({min_instances}) is above --max-instances ({max_instances})")
    return AutoscaleSettings(scale_up, scale_down, window, min_instances, max_instances)


def _check_where(simulate: bool, ray_tasks: bool, ray_address: str | None, ray_cpus: int | None, metrics: bool) -> None:
    """Where the fleet runs (this process, Ray tasks, Ray actors), checked before any output; Ray found and its
    cluster reached when it will run."""
    if simulate and metrics:
        raise KvbenchError(
            "--metrics-port/--metrics-file need real instances: a simulated fleet runs on a virtual clock"
        )
    if ray_tasks and not simulate:
        raise KvbenchError("--ray fans out simulated policies; real instances always run on Ray (--ray-address)")
    if simulate and not ray_tasks and (ray_address is not None or ray_cpus is not None):
        given = "--ray-address" if ray_address is not None else "--ray-cpus"
        raise KvbenchError(f"{given} goes with --ray: without it a simulated fleet runs in this process")
    if not simulate or ray_tasks:  # Ray will run: is it there, and is the cluster reachable? (before any output)
        prepare_ray(ray_address)


def _run(options, out_dir: Path | None, as_json: bool, metrics_port: int | None, metrics_file: Path | None) -> None:
    from kvbench.studies.fleet.fleet_setup import FleetSetup  # torch loads only when a fleet runs
    from kvbench.studies.fleet.study import run_fleet  # (and Ray, when asked for)

    console = make_console(stderr=as_json)
    with console.status("preparing the fleet..."):
        setup = FleetSetup.resolve(options)
    fleet_run = Run("fleet")
    points: list[FleetPoint] = []

    def on_point(point: FleetPoint) -> None:  # each policy's point as it finishes (results.jsonl has them too)
        points.append(point)
        fleet_run.points.append(point.to_json())  # what the run measured: an error then keeps its directory
        console.print(_done_line(point))

    with fleet_run.guarded(lambda: _keep_interrupted(fleet_run, points, setup, len(options.policies))):
        run_dir = fleet_run.open(out_dir)
        if (run_dir / "results.jsonl").exists():
            raise KvbenchError(f"{run_dir} already holds results; choose another --out")
        _intro(console, setup)
        metrics = _metrics(setup, metrics_port, console)
        fleet_run.hold(lambda: _stop_metrics(metrics, metrics_file))
        with console.status(f"running {len(options.policies)} polic{'y' if len(options.policies) == 1 else 'ies'}..."):
            run_fleet(
                setup, run_dir, on_point=on_point, metrics=metrics
            )  # the actors and Ray shut down however it ends
    meta = FleetMeta.from_json(setup.meta())
    document = write_outputs(run_dir, meta, points)
    fleet_run.opened.release()
    show(document, as_json, lambda: _tables(console, points, run_dir, options.simulate, meta))
    died = [f"server {i.name} died under {policy}: {i.failure}" for policy, i in deaths(points) if i.name]
    if died:
        skipped = len(options.policies) - len(points)
        left = f"; {skipped} policies not run, every server having died" if skipped else ""
        raise RunFailed(f"{'; '.join(died)}; the figures of the others are kept in {run_dir}{left}")
    failed = [p for p in points if p.status == "error"]
    if failed:
        raise RunFailed(
            f"{len(failed)} of {len(points)} policies completed no request, e.g. {failed[0].policy}: {failed[0].error}"
        )


def _keep_interrupted(run: Run, points: list[FleetPoint], setup, policies: int) -> None:
    """Ctrl-C: write the summary of the policies that finished (or discard an empty run)."""
    if run.dir is None:
        note = "interrupted before any policy finished; nothing was written"
    elif points:
        write_outputs(run.dir.path, FleetMeta.from_json({**setup.meta(), "interrupted": True}), points)
        run.dir.release()
        note = (
            f"interrupted: {len(points)} of {policies} policies finished; their summary is in "
            f"{run.dir.path}/summary.json"
        )
    else:
        run.dir.discard()  # releases the lock too
        note = "interrupted before any policy finished; nothing was written"
    typer.echo(note, err=True)


def _tables(console, points: list[FleetPoint], run_dir: Path, simulated: bool, meta: FleetMeta) -> None:
    for point in points:
        if len(point.instances) <= 16:
            console.print(instance_table(point))
    console.print(fleet_table(points, simulated))  # the policies side by side last, under them the conclusion
    if meta.simulator_check is not None:
        console.print(simulator_table(meta.simulator_check))
    headline, tone, sentences = fleet_verdict(points, meta)
    console.print(f"[bold]{headline}[/bold]")
    for sentence in sentences[:-1]:  # the last is the page's standing caveat
        console.print(sentence, markup=False, highlight=False)
    plots = "fleet_usage.png, fleet_ttft_cdf.png, and fleet_instances.png where the fleet scaled"
    check = ", simulator-check.json" if meta.simulator_check is not None else ""
    console.print(wrote_line(run_dir, f"summary.json, summary.csv, summary.md, results.jsonl{check}, {plots}"))


def _stop_metrics(metrics, path: Path | None) -> None:
    if metrics is not None:
        metrics.close()
        if path is not None:
            metrics.write_textfile(path)


def _intro(console, setup) -> None:
    if setup.skipped is not None:
        console.print(f"[yellow]warning: {setup.skipped.sentence('records')}[/yellow]")
    if setup.options.simulate:
        console.print(
            "[bold yellow]SIMULATED[/bold yellow]: tensor-free simulator instances, roofline step times of "
            f"{setup.options.gpu}, virtual clock; an added instance starts in {setup.options.startup_s:g} s "
            "(a setting: nothing to measure in a simulation)"
        )
    if setup.dataset is not None:
        console.print(f"dataset: {setup.dataset.note()}")
    if setup.options.servers is not None:
        names = ", ".join(f"{t.name}={t.url}" for t in setup.options.servers.targets)
        console.print(
            f"{len(setup.options.servers.targets)} servers over HTTP ({names}); {len(setup.pairs)} requests, "
            f"arrivals: {setup.arrival_source}; prompts drawn in the vocabulary of {setup.model_name}"
        )
        return
    console.print(
        f"{setup.options.instances} x {setup.model_name} ({setup.config.engine}); KV pool: "
        f"{setup.budget_source}; {len(setup.pairs)} requests, arrivals: {setup.arrival_source}"
        + ("; --rate sets another" if setup.rate_chosen is not None else "")
    )


def _done_line(point: FleetPoint) -> str:
    return (
        f"{point.policy:>17}: {point.completed} done, {point.rejected} rejected, "
        f"p99 TTFT {point.p99_ttft_ms or 0:,.0f} ms, {point.preemptions} preemptions, "
        f"{point.output_throughput:,.1f} output tok/s"
    )


def _metrics(setup, port: int | None, console):
    if setup.options.simulate or setup.options.servers is not None:
        return None
    metrics = FleetMetrics(setup.config.engine, setup.options.device)
    if port is not None:
        metrics.serve("127.0.0.1", port)
        console.print(f"Prometheus metrics: {metrics.url}")
    return metrics


def register(app: typer.Typer) -> None:
    app.command("fleet", help=HELP)(fleet)
