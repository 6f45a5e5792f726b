"""A fleet of servers over HTTP (vLLM, SGLang, ``kvbench serve``: anything OpenAI-compatible), with kvbench's load
generator as the router.

Each arrival goes, at its time on the wall clock, to the server the policy picks from what a router can know:
each server's ``/metrics`` scraped every interval (KV usage, running, waiting), the requests it sent there and
has not seen end, and, for ``precise-prefix``, the blocks each server holds as its KV event stream tells
(``prefix_index.HeldBlocks``, fed from the listening thread). Every policy replays the same requests at the same
offsets after every server's prefix cache was reset. A server that refuses connections, fails three requests
in a row, or whose ``/metrics`` fails three scrapes in a row, is marked dead with the reason; the router stops
sending to it, a request it never reached goes once to another server, and the run goes on. Every request ends
as one record, on the server that had it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp

from kvbench.endpoint.cache_reset import reset_prefix_cache
from kvbench.endpoint.client import EndpointClient, RequestLimits, Target, list_models, open_session
from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber
from kvbench.endpoint.openai import api_key_from_env, check_key_transport
from kvbench.endpoint.record import RequestRecord
from kvbench.endpoint.scraper import fetch_metrics
from kvbench.engine.instance import InstanceStats
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.step_totals import StepTotals
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import blocks_for
from kvbench.measure.kv_events import EventBatch
from kvbench.report.fleet_report import DEAD_BEFORE
from kvbench.results.servers import ServerState, read_states
from kvbench.studies.fleet.core import DEAD, SERVING, FleetRouter, FleetRun, InstanceSlot, reject
from kvbench.studies.fleet.prefix_index import HeldBlocks, feed_events
from kvbench.studies.fleet.routing import PrecisePrefix, RoutingPolicy

SCRAPES_TO_DEATH = 3  # failed scrapes in a row that mark a server dead
FAILURES_TO_DEATH = 3  # failed requests in a row (after a connection, an error answer) that mark it failing
PROBE_TIMEOUT_S = 2.0
CONNECTION_FAILURES = frozenset({"connect", "disconnect"})


@dataclass
class Server:
    """One target as the fleet knows it across policies."""

    index: int
    target: Target
    model: str = ""
    family: str | None = None
    block_size: int | None = None
    total_blocks: int = 0
    held: HeldBlocks = field(default_factory=HeldBlocks)  # its resident blocks, from its KV events
    subscriber: KvEventSubscriber | None = None
    heard: int = 0  # KV event batches heard so far
    dead: str | None = None  # why it was given up (it stays given up for the policies after)

    @property
    def name(self) -> str:
        return self.target.name or self.target.url


@dataclass
class _Tally:
    """What the router counted on one server during one policy."""

    finished: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    uncounted: int = 0  # finished requests whose answer did not say how many prompt tokens were cached
    scrape_failures: int = 0
    outcomes: list[bool | None] = field(default_factory=list)  # each request sent here, in send order: ok, or None
    usage_unread: str | None = None  # why its KV usage could not be read (the router keeps its last reading)
    hits_unread: str | None = None  # why its prefix-cache counters could not be used
    base: ServerState | None = None  # the scrape before the policy's load (the counters' start)
    last: ServerState | None = None
    sent_at: dict[int, float] = field(default_factory=dict)  # request id -> when it was sent (fleet clock)


class ServerFleet:
    """The servers of a run: probed once (``open``), then one policy after another (``run``), then ``close``."""

    def __init__(
        self,
        targets: Sequence[Target],
        limits: RequestLimits,
        scrape_interval_s: float,
        block_size: int,
    ) -> None:
        self.servers = [Server(index, target) for index, target in enumerate(targets)]
        self.limits = limits
        self.scrape_interval_s = scrape_interval_s
        self.block_size = block_size  # the router's block, until the servers say theirs
        self.session: aiohttp.ClientSession | None = None
        self.api_key: str | None = None

    # -- set-up ---------------------------------------------------------------------------------------------
    async def open(self) -> None:
        """Every server answers its model list and its metrics, and says its KV block size; a server that does
        not is refused in one line before any load."""
        names = {target.api_key_env for target in (s.target for s in self.servers)}
        self.api_key = api_key_from_env(next(iter(names))) if len(names) == 1 else None
        for server in self.servers:
            check_key_transport(server.target.url, self.api_key)
        self.session = open_session(self.limits)
        await asyncio.gather(*(self._probe(server) for server in self.servers))
        sizes = {server.block_size for server in self.servers if server.block_size}
        if len(sizes) > 1:
            raise KvbenchError(
                "the servers use different KV block sizes ("
                + ", ".join(f"{s.name}: {s.block_size}" for s in self.servers)
                + "): a prefix is counted in one block size; run servers alike"
            )
        if sizes:
            self.block_size = sizes.pop()
        for server in self.servers:
            if server.target.kv_events is not None:
                server.subscriber = KvEventSubscriber(
                    server.target.kv_events,
                    server.target.kv_events_replay,
                    bind=server.target.kv_events_bind,
                    max_events=0,  # the router keeps its index, not the events
                    on_batch=self._listener(server),
                )
                try:
                    await asyncio.to_thread(server.subscriber.start)
                except OSError as err:
                    raise KvbenchError(f"{server.name}: {err}") from None

    def _listener(self, server: Server) -> Callable[[EventBatch], None]:
        def heard(batch: EventBatch) -> None:
            server.heard += 1
            feed_events(server.held, batch.events, self.block_size)

        return heard

    async def _probe(self, server: Server) -> None:
        assert self.session is not None
        target = server.target
        try:
            models = [target.model] if target.model else await list_models(self.session, target, self.api_key)
        except KvbenchError as err:
            raise KvbenchError(f"{server.name}: {err}") from None
        if not models:
            raise KvbenchError(f"{server.name}: {target.url}/v1/models lists no model")
        server.model = models[0]
        try:
            states = read_states(await fetch_metrics(self.session, target.scrape_url, 5.0), target.scrape_url)
        except KvbenchError as err:
            raise KvbenchError(f"{server.name}: {err} (a router reads every server's KV usage)") from None
        state = _one_state(states)
        server.family, server.block_size = state.family, state.block_size
        server.total_blocks = int(state.total_blocks or 0)
        if not server.total_blocks:
            raise KvbenchError(
                f"{server.name}: {target.scrape_url} does not give the server's KV capacity in blocks "
                "(vLLM: cache_config_info; kvbench serve: kvbench_kv_cache_blocks_capacity)"
            )

    async def close(self) -> None:
        for server in self.servers:
            if server.subscriber is not None:
                await asyncio.to_thread(server.subscriber.stop, 0.0)
                server.subscriber = None
        if self.session is not None:
            await self.session.close()
            self.session = None

    # -- one policy -----------------------------------------------------------------------------------------
    async def run(self, policy: RoutingPolicy, arrivals: Sequence[tuple[float, Request]], name: str) -> FleetRun | None:
        """Reset every live server's prefix cache, replay ``arrivals`` through ``policy``, and record the run;
        None when every server has died (the policies left are not run)."""
        assert self.session is not None, "open() first"
        if isinstance(policy, PrecisePrefix):
            missing = [s.name for s in self.servers if s.dead is None and s.subscriber is None]
            if missing:
                raise KvbenchError(f"precise-prefix reads every server's KV events; none listened to for {missing[0]}")
            policy.held = {server.index: server.held for server in self.servers}
        notes: list[str] = []
        live = [server for server in self.servers if server.dead is None]
        if not live:
            return None
        for server, reset in zip(
            live,
            await asyncio.gather(*(self._reset(server) for server in live)),
            strict=True,
        ):
            if reset["reset"] is not True:
                notes.append(
                    f"{server.name}: prefix cache not reset before {name} ({reset['detail']}): blocks an earlier "
                    "policy left may raise its hit rate"
                )
        heard = {server.index: server.heard for server in live}
        run = await _PolicyRun(self, policy, name, notes).go(arrivals)
        if isinstance(policy, PrecisePrefix):
            for server in live:
                if server.dead is None and server.heard == heard[server.index]:
                    notes.append(f"no KV event came from {server.name}: it was routed by its load alone")
        return run

    async def _reset(self, server: Server) -> dict:
        assert self.session is not None
        return await reset_prefix_cache(self.session, server.target.url, server.family, self.api_key)

    async def state(self, server: Server, timeout_s: float | None = None) -> ServerState | str:
        """The server's state now, or why it could not be read."""
        assert self.session is not None
        url = server.target.scrape_url
        try:
            text = await fetch_metrics(self.session, url, timeout_s or min(5.0, max(1.0, 2 * self.scrape_interval_s)))
            return _one_state(read_states(text, url))
        except KvbenchError as err:
            return str(err)


class _PolicyRun:
    """One policy's replay: the slots, the router, the scrape loop and the requests in flight."""

    def __init__(self, fleet: ServerFleet, policy: RoutingPolicy, name: str, notes: list[str]) -> None:
        self.fleet = fleet
        self.name = name
        self.notes = notes
        self.router = FleetRouter(policy, fleet.block_size)
        session = fleet.session
        assert session is not None, "the fleet is open"
        self.clients = {
            s.index: EndpointClient(s.target, s.model, session, fleet.limits, fleet.api_key, 0.0) for s in fleet.servers
        }
        self.tallies = {s.index: _Tally() for s in fleet.servers}
        self.slots: list[InstanceSlot] = []
        self.ended: list[Request] = []
        self.placement: dict[int, int] = {}
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        self.fleet_samples: list[tuple[float, int, int]] = []
        self.step_samples: list[tuple[float, int, StepTotals]] = []
        self.events: list[tuple[float, str, int]] = []
        self.rerouted = 0
        self.origin = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.origin

    async def go(self, arrivals: Sequence[tuple[float, Request]]) -> FleetRun:
        fleet = self.fleet
        states = await asyncio.gather(*(fleet.state(s) for s in fleet.servers if s.dead is None))
        live = iter(states)
        for server in fleet.servers:
            slot = InstanceSlot(server.index, server, SERVING, started_at=0.0, ready_at=0.0, name=server.name)
            if server.dead is not None:
                slot.state, slot.failure, slot.stopped_at = DEAD, DEAD_BEFORE, 0.0
            else:
                state = next(live)
                if isinstance(state, str):
                    self._died(slot, state, 0.0)
                else:
                    self.tallies[server.index].base = state
                    slot.stats = self._stats(slot, state, 0.0)
                    if state.steps is not None:
                        self.step_samples.append((0.0, server.index, state.steps))
            self.slots.append(slot)
        self.origin = time.perf_counter()
        scraping = asyncio.ensure_future(self._scrape_loop())
        tasks: list[asyncio.Task] = []
        try:
            for at, request in arrivals:
                delay = at - self.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                request.arrival_time = at
                tasks.append(asyncio.ensure_future(self._route(request)))
            await asyncio.gather(*tasks)
        finally:
            scraping.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(scraping, *tasks, return_exceptions=True)
        end = max((r.finish_time or r.arrival_time for r in self.ended), default=self.now())
        await asyncio.sleep(0.3)  # a server counts a step's tokens at the step's end: let the counters settle
        await self._scrape(end, final=True)
        order = {request.request_id: position for position, (_, request) in enumerate(arrivals)}
        self.ended.sort(key=lambda r: order[r.request_id])
        return FleetRun(
            self.name,
            self.ended,
            self.placement,
            self.slots,
            self.samples,
            self.fleet_samples,
            self.events,
            end,
            rerouted=self.rerouted,
            simulated=False,
            notes=self.notes,
            step_samples=self.step_samples,
        )

    # -- routing and sending --------------------------------------------------------------------------------
    async def _route(self, request: Request, tried: frozenset[int] = frozenset()) -> None:
        candidates = [slot for slot in self.slots if slot.index not in tried]
        slot = self.router.choose(request, candidates)
        if slot is None:
            why = "no server was alive when it arrived" if not tried else "its server died and no other was alive"
            self.ended.append(reject(request, why, "no_instance"))
            return
        self.placement[request.request_id] = slot.index
        tally = self.tallies[slot.index]
        tally.sent_at[request.request_id] = self.now()
        order = len(tally.outcomes)
        tally.outcomes.append(None)
        record = await self._send(slot, request)
        slot.outstanding.pop(request.request_id, None)
        tally.sent_at.pop(request.request_id, None)
        tally.outcomes[order] = record.ok
        if record.ok:
            self._finished(slot, request, record)
            return
        if record.error_kind in CONNECTION_FAILURES:
            await self._check_alive(slot, record.reason())
        if _failed_in_a_row(tally.outcomes, order) >= FAILURES_TO_DEATH:
            self._died(slot, f"{FAILURES_TO_DEATH} requests in a row failed, the last: {record.reason()}", self.now())
        if record.error_kind == "connect" and slot.state == DEAD and not tried:  # it never reached that server
            self.rerouted += 1
            await self._route(request, tried | {slot.index})
            return
        tally.failed += 1
        self.ended.append(reject(request, f"{slot.handle.name}: {record.reason()}", record.error_kind or "client"))

    async def _send(self, slot: InstanceSlot, request: Request) -> RequestRecord:
        ids = request.prompt_token_ids
        assert ids, "a server fleet's requests carry token ids"
        turn = Turn(tuple(ids), request.max_tokens, len(ids), ignore_eos=True)
        conversation = Conversation(request.request_id, (turn,))
        return await self.clients[slot.index].send(conversation, 0, (), RequestRecord(request.request_id, 0))

    def _finished(self, slot: InstanceSlot, request: Request, record: RequestRecord) -> None:
        assert record.ttft is not None and record.latency is not None
        sent = record.start - self.origin
        request.status = RequestStatus.FINISHED
        request.first_token_time = sent + record.ttft
        request.finish_time = sent + record.latency
        request.num_outputs = record.output_tokens or len(record.token_times)
        request.token_times = [sent + t for t in record.token_times]
        tally = self.tallies[slot.index]
        tally.finished += 1
        tally.prompt_tokens += record.prompt_tokens or request.prompt_len
        if record.cached_tokens is None:
            tally.uncounted += 1
        else:
            tally.cached_tokens += record.cached_tokens
            request.num_cached_tokens = record.cached_tokens
        slot.last_end = max(slot.last_end, request.finish_time)
        self.ended.append(request)

    async def _check_alive(self, slot: InstanceSlot, reason: str) -> None:
        """After a connection failure: a server whose metrics do not answer either is dead."""
        if slot.state == DEAD:
            return
        state = await self.fleet.state(slot.handle, PROBE_TIMEOUT_S)
        if isinstance(state, str):
            self._died(slot, f"{reason}; its metrics did not answer either", self.now())

    def _died(self, slot: InstanceSlot, reason: str, t: float) -> None:
        if slot.state == DEAD:
            return
        slot.state, slot.failure, slot.stopped_at = DEAD, reason, t
        slot.handle.dead = f"died under {self.name}: {reason}"
        self.events.append((t, "died", slot.index))

    def _counted_hits(self, slot: InstanceSlot, state: ServerState) -> tuple[int, int]:
        """(prompt tokens looked up, of which cached) from the server's counters over this policy; (0, 0), with a
        note, where they cannot be true (gone backwards, more hits than lookups, missing): the hit rate is then
        unknown, never 0%."""
        tally = self.tallies[slot.index]
        base = tally.base
        queries = (
            None if base is None or state.prefix_queries is None else state.prefix_queries - (base.prefix_queries or 0)
        )
        hits = None if base is None or state.prefix_hits is None else state.prefix_hits - (base.prefix_hits or 0)
        if queries is not None and hits is not None and 0 <= hits <= queries:
            return int(queries), int(hits)
        if tally.hits_unread is None:
            tally.hits_unread = "its answers gave no cached token counts and its prefix-cache counters " + (
                "are missing"
                if queries is None or hits is None
                else f"cannot be true ({hits:g} hits of {queries:g} lookups since the policy began)"
            )
            self.notes.append(f"{slot.handle.name}: prefix hit rate unknown under {self.name}: {tally.hits_unread}")
        return 0, 0

    def _usage_unread(self, slot: InstanceSlot, state: ServerState) -> None:
        tally = self.tallies[slot.index]
        if tally.usage_unread is None:
            why = "; ".join(f"{k}: {v}" for k, v in state.invalid.items()) or "its metrics give no KV usage"
            tally.usage_unread = why
            self.notes.append(
                f"{slot.handle.name}: KV usage unread under {self.name} ({why}); the router kept its last reading"
            )

    # -- what the router reads ------------------------------------------------------------------------------
    async def _scrape_loop(self) -> None:
        interval = self.fleet.scrape_interval_s
        ticks = 0
        while True:
            ticks += 1
            delay = ticks * interval - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._scrape(self.now())

    async def _scrape(self, t: float, final: bool = False) -> None:
        live = [slot for slot in self.slots if slot.state != DEAD]
        states = await asyncio.gather(*(self.fleet.state(slot.handle) for slot in live))
        for slot, state in zip(live, states, strict=True):
            tally = self.tallies[slot.index]
            if isinstance(state, str):
                tally.scrape_failures += 1
                if tally.scrape_failures >= SCRAPES_TO_DEATH:
                    self._died(slot, f"{SCRAPES_TO_DEATH} scrapes failed in a row, the last: {state}", t)
                continue
            tally.scrape_failures = 0
            slot.stats = self._stats(slot, state, t)
            if state.steps is not None:
                self.step_samples.append((t, slot.index, state.steps))
            if final:
                slot.final_stats = slot.stats
            if state.free_blocks is None:  # no usage to plot; the router keeps its last reading
                self._usage_unread(slot, state)
                continue
            stats = slot.stats
            self.samples.append((t, slot.index, stats.used_blocks, stats.total_blocks, stats.running, stats.waiting))
        for slot in self.slots:  # a dead server's last report stands as its final one
            if slot.state == DEAD and slot.final_stats is None and slot.stats is not None:
                slot.final_stats = self._stats(slot, None, t)
        serving = sum(1 for slot in self.slots if slot.state == SERVING)
        self.fleet_samples.append((t, serving, 0))

    def _stats(self, slot: InstanceSlot, state: ServerState | None, t: float) -> InstanceStats:
        """What the router knows of ``slot``: the server's gauges, and its own counts of what it sent."""
        tally = self.tallies[slot.index]
        state = state or tally.last or tally.base
        assert state is not None
        tally.last = state
        total = int(state.total_blocks or slot.handle.total_blocks)
        if state.free_blocks is not None:
            free = int(round(state.free_blocks))
        else:  # unread: the last reading stands; none yet, the server counts as full (never as empty)
            free = slot.stats.free_blocks if slot.stats is not None else 0
        blocks = {rid: blocks_for(r.prompt_len, self.fleet.block_size) for rid, r in slot.outstanding.items()}
        waiting = int(state.waiting or 0)
        mean_blocks = sum(blocks.values()) / len(blocks) if blocks else 0.0
        slot.transit_blocks = sum(n for rid, n in blocks.items() if tally.sent_at.get(rid, 0.0) > t)
        base = tally.base
        preemptions = int((state.preemptions or 0) - ((base.preemptions or 0) if base else 0))
        prompt, cached = tally.prompt_tokens, tally.cached_tokens
        if tally.finished and tally.uncounted == tally.finished:  # the answers did not say: the server's counters
            prompt, cached = self._counted_hits(slot, state)
        return InstanceStats(
            time=t,
            total_blocks=total,
            free_blocks=max(0, min(total, free)),
            running=int(state.running or 0),
            waiting=waiting,
            waiting_blocks=round(waiting * mean_blocks),
            preemptions=max(0, preemptions),
            finished=tally.finished,
            rejected=tally.failed,
            prompt_tokens=prompt,
            cached_tokens=cached,
        )


def _failed_in_a_row(outcomes: list[bool | None], at: int) -> int:
    """The run of failures around ``at``, in the order the requests were sent: a success, or a request still in
    flight, sent between two failures breaks it (a quick refusal can end before a slow success sent earlier)."""
    start = at
    while start > 0 and outcomes[start - 1] is False:
        start -= 1
    end = at
    while end + 1 < len(outcomes) and outcomes[end + 1] is False:
        end += 1
    return end - start + 1


def _one_state(states: list[ServerState]) -> ServerState:
    """The one engine a server's page describes (a server of several engines is several targets here)."""
    if len(states) != 1:
        raise KvbenchError(
            f"the metrics describe {len(states)} engines; a fleet target must be one engine (route to each)"
        )
    return states[0]


async def run_policies(
    fleet: ServerFleet,
    policies: Callable[[], Iterable[tuple[str, RoutingPolicy]]],
    arrivals: Callable[[], list[tuple[float, Request]]],
    record: Callable[[FleetRun], None],
) -> None:
    """Open the fleet, run each policy (made once the servers are known) on fresh copies of the arrivals, record
    each run; close however it ends."""
    try:
        await fleet.open()
        for name, policy in policies():
            run = await fleet.run(policy, arrivals(), name)
            if run is None:
                break
            record(run)
    finally:
        await fleet.close()
