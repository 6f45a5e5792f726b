"""What each engine step left in the KV pool, accounted afterwards with hindsight.

Which held slots are ``reserved`` (a request will still write them) and which are ``internal`` (it never
will) depends on each request's final length, known only when it finishes. So the engine keeps a small
snapshot per step and the accountant is built when the run is over.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.engine.request import Request
from kvbench.engine.scheduler import Scheduler
from kvbench.kv.accounting import WasteAccountant


@dataclass
class StepSnapshot:
    seconds: float  # the step's duration, filled in when it ends
    live: list[tuple[int, int, int]]  # (request id, held slots, kv length after the step)
    held: int
    external: int
    unique_used: int | None = None  # token states stored, each shared slot once (runs with forks only)
    unique_internal: int = 0  # slots of held blocks no owner will ever write (runs with forks only)


class StepLog:
    def __init__(self, pool_slots: int, block_size: int) -> None:
        self.pool_slots = pool_slots
        self.block_size = block_size
        self.snapshots: list[StepSnapshot] = []

    def snapshot(self, scheduler: Scheduler, clock: int, shared: bool) -> StepSnapshot:
        """The pool's state after this step's writes (before its finished requests leave)."""
        live = [(r.request_id, r.held_slots, r.kv_len(clock)) for r in scheduler.running.values()]
        used, internal = _shared_block_states(scheduler, clock) if shared else (None, 0)
        record = StepSnapshot(0.0, live, scheduler.held_slots(), scheduler.external_slots(), used, internal)
        self.snapshots.append(record)
        return record

    def accountant(self, requests: list[Request]) -> WasteAccountant:
        """Account every step with hindsight: each request's real final length splits reserved from internal."""
        accountant = WasteAccountant(self.pool_slots, self.block_size)
        final = {r.request_id: r.final_kv_len for r in requests if r.final_kv_len is not None}
        for record in self.snapshots:
            if record.unique_used is not None:  # shared blocks: count each slot once, whoever owns it
                used, internal = record.unique_used, record.unique_internal
                capped = record.held - internal
            else:
                used = sum(kv for _, _, kv in record.live)
                capped = sum(min(held, final.get(rid, held)) for rid, held, _ in record.live)
                internal = sum(max(held - final.get(rid, held), 0) for rid, held, _ in record.live)
            accountant.add_span(1, used0=used, grow=0, capped_held=capped, internal=internal,
                                external=record.external, held=record.held, running=len(record.live),
                                base_s=record.seconds)
        return accountant


def _shared_block_states(scheduler: Scheduler, clock: int) -> tuple[int, int]:
    """(token states stored, slots never to be written) over the pool's blocks, a shared block counted once.

    A slot is written if any owner has written it; it is internal if no owner will reach it before its
    expected end (prompt + max_tokens - 1: the run's length when EOS is ignored, as in benchmarks).
    """
    block_size = scheduler.block_size
    written: dict[int, int] = {}
    reach: dict[int, int] = {}
    for request in scheduler.running.values():
        kv_len, final = request.kv_len(clock), request.expected_kv_len
        for index, block in enumerate(scheduler.manager.block_table(request.request_id)):
            start = index * block_size
            written[block] = max(written.get(block, 0), min(block_size, max(0, kv_len - start)))
            reach[block] = max(reach.get(block, 0), min(block_size, max(0, final - start)))
    return sum(written.values()), sum(block_size - filled for filled in reach.values())
