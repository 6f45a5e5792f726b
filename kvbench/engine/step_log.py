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
    tables: list[tuple[int, tuple[int, ...]]] | None = None  # (request id, its blocks) of runs with forks


class StepLog:
    def __init__(self, pool_slots: int, block_size: int) -> None:
        self.pool_slots = pool_slots
        self.block_size = block_size
        self.snapshots: list[StepSnapshot] = []

    def snapshot(self, scheduler: Scheduler, clock: int, shared: bool) -> StepSnapshot:
        """The pool's state after this step's writes (before its finished requests leave)."""
        live = [(r.request_id, r.held_slots, r.kv_len(clock)) for r in scheduler.running.values()]
        used, tables = _shared_block_states(scheduler, clock) if shared else (None, None)
        record = StepSnapshot(0.0, live, scheduler.held_slots(), scheduler.external_slots(), used, tables)
        self.snapshots.append(record)
        return record

    def accountant(self, requests: list[Request]) -> WasteAccountant:
        """Account every step with hindsight: each request's real final length splits reserved from internal."""
        accountant = WasteAccountant(self.pool_slots, self.block_size)
        final = {r.request_id: r.final_kv_len for r in requests if r.final_kv_len is not None}
        for record in self.snapshots:
            if record.unique_used is not None:  # shared blocks: count each slot once, whoever owns it
                used = record.unique_used
                internal = _unreached_slots(record.tables, final, self.block_size)
                capped = record.held - internal
            else:
                used = sum(kv for _, _, kv in record.live)
                capped = sum(min(held, final.get(rid, held)) for rid, held, _ in record.live)
                internal = sum(max(held - final.get(rid, held), 0) for rid, held, _ in record.live)
            accountant.add_span(
                1,
                used0=used,
                grow=0,
                capped_held=capped,
                internal=internal,
                external=record.external,
                held=record.held,
                running=len(record.live),
                base_s=record.seconds,
            )
        return accountant


def _shared_block_states(scheduler: Scheduler, clock: int) -> tuple[int, list[tuple[int, tuple[int, ...]]]]:
    """Token states stored over the pool's blocks (a slot written by any owner counted once), and each live
    request's blocks, from which the slots no owner will ever write are counted once the real lengths are known."""
    block_size = scheduler.block_size
    written: dict[int, int] = {}
    tables = []
    for request in scheduler.running.values():
        kv_len = request.kv_len(clock)
        table = tuple(scheduler.manager.block_table(request.request_id))
        tables.append((request.request_id, table))
        for index, block in enumerate(table):
            written[block] = max(written.get(block, 0), min(block_size, max(0, kv_len - index * block_size)))
    return sum(written.values()), tables


def _unreached_slots(tables, final: dict[int, int], block_size: int) -> int:
    """Slots of the held blocks that no owner reaches before its real end (hindsight: EOS may come early)."""
    reach: dict[int, int] = {}
    for request_id, table in tables:
        end = final.get(request_id)
        for index, block in enumerate(table):
            filled = block_size if end is None else min(block_size, max(0, end - index * block_size))
            reach[block] = max(reach.get(block, 0), filled)
    return sum(block_size - filled for filled in reach.values())
