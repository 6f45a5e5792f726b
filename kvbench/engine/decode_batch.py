"""The decode step's host arrays, kept from one step to the next (a persistent batch, as vLLM keeps one).

Between two decode steps over the same running requests little changes: every request brings its newest
token, positions and lengths advance by one, and a block table changes only for a request that was given a
new block or a copy-on-write copy. So instead of packing every array again from Python lists, the batch is
rebuilt only when the set of running requests changes or the longest context enters a new block, and is
otherwise advanced in place with a few numpy operations; the requests whose tables changed are patched one
row each.

When the runner can keep the attention plan by viewing these arrays (CPU, torch kernels), the batch also
keeps the softmax bias the plan reads: each step makes one more position visible per request.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvbench.engine.request import Request
from kvbench.models.runner import ModelRunner, StepInput


class DecodeBatch:
    """Decode inputs of the running requests, for ``ModelRunner.decode_step_input``."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.requests: list[Request] = []
        self.params: list = []  # each request's sampling parameters, in batch order
        self.generators: list = []  # each request's random generator (None for greedy), in batch order
        self._changed_tables: list[int] = []
        self._rows: dict[int, int] = {}
        self._longs = np.zeros(0, dtype=np.int64)  # tokens | positions | slots
        self._ints = np.zeros(0, dtype=np.int32)  # context lens | query starts | block tables [B, W]
        self._width = 0
        self._max_position = 0
        self._table_rows = np.zeros((0, 0), dtype=np.int32)
        self._row_index = np.zeros(0, dtype=np.int64)
        self._step: StepInput | None = None  # the runner's view of the arrays above
        self._bias: np.ndarray | None = None  # [B, W * block_size]: 0 visible, -inf not yet written

    def forget(self) -> None:
        """Rebuild at the next step: a request preempted and admitted again has new blocks and a recomputed
        context, though the batch may hold the same requests in the same order as before."""
        self.requests = []

    def table_changed(self, request_id: int) -> None:
        """``request_id`` was given a block or a copy-on-write copy: its table row is read again."""
        self._changed_tables.append(request_id)

    def step(
        self,
        batch: list[Request],
        clock: int,
        table_of: Callable[[int], list[int]],
        generators: dict,
    ) -> StepInput:
        """The step input of ``batch`` (the running requests, in order) at decode clock ``clock``.

        On the CPU the returned tensors share memory with the batch's arrays: they hold this step's values
        until the next call (the engine consumes a step before asking for the next one).
        """
        same = batch == self.requests  # identity per element: same requests, same order (never empty)
        if same and (self._max_position + 1) // self.block_size < self._width:  # the longest stays in its blocks
            self._advance(batch, table_of)
        else:
            self._rebuild(batch, clock, table_of, generators)
        self._changed_tables.clear()
        assert self._step is not None  # set by the first _rebuild (an empty batch never reaches _advance)
        return self.runner.refresh_decode_input(self._step, self._max_position + 1)

    def _rebuild(self, batch: list[Request], clock: int, table_of, generators: dict) -> None:
        count = len(batch)
        tables = [table_of(r.request_id) for r in batch]
        kv_lens = [r.kv_len(clock) for r in batch]
        # tables are kept as wide as the longest context needs, not as wide as what is held: a contiguous
        # request holds its whole reservation, and both engines should pay for the blocks they read
        width = max(kv_lens) // self.block_size + 1
        self._longs = np.empty(3 * count, dtype=np.int64)
        self._ints = np.zeros(2 * count + 1 + count * width, dtype=np.int32)
        self._width = width
        self._ints[count : 2 * count + 1] = np.arange(count + 1)
        rows = self._ints[2 * count + 1 :].reshape(count, width)
        for row, table in enumerate(tables):
            rows[row, : min(len(table), width)] = table[:width]
        self._table_rows = rows
        self._row_index = np.arange(count)
        positions = self._longs[count : 2 * count]
        positions[:] = kv_lens
        self._max_position = int(positions.max())
        self._write_tokens_and_slots(batch)
        self.requests = list(batch)
        self._rows = {r.request_id: row for row, r in enumerate(batch)}
        self.params = [r.sampling for r in batch]
        self.generators = [generators[r.request_id] for r in batch]
        self._bias = None
        if self.runner.keeps_plan_for(kv_lens):
            lens = self._ints[:count]
            self._bias = np.where(
                np.arange(width * self.block_size)[None, :] < lens[:, None], np.float32(0.0), np.float32(-np.inf)
            )
        # on the CPU one set of tensors views the arrays for as long as they live: advancing them in place is all
        self._step = self.runner.persistent_decode_input(
            self._longs, self._ints, count, width, self._max_position + 1, self._bias
        )

    def _advance(self, batch: list[Request], table_of) -> None:
        count = len(batch)
        self._longs[count : 2 * count] += 1  # every position moves on by the token written last step
        self._max_position += 1
        rows = self._table_rows
        width = self._width
        for request_id in self._changed_tables:
            row = self._rows.get(request_id)
            if row is None:  # given room, then preempted in the same step (a newcomer, the newest): not here
                continue
            table = table_of(request_id)[:width]
            rows[row, : len(table)] = table
            rows[row, len(table) :] = 0
        self._write_tokens_and_slots(batch)
        if self._bias is not None:
            self._bias[self._row_index, self._longs[count : 2 * count]] = 0.0  # this step's token becomes visible
        if self.runner.device.type != "cpu":  # the device tensors are copies: send this step's values
            self._step = self.runner.persistent_decode_input(
                self._longs, self._ints, count, width, self._max_position + 1
            )

    def _write_tokens_and_slots(self, batch: list[Request]) -> None:
        """Newest tokens, each position's slot through its block table, and the context lengths."""
        count, bs = len(batch), self.block_size
        longs = self._longs
        longs[:count] = [r.output_token_ids[-1] for r in batch]
        positions = longs[count : 2 * count]
        blocks, offsets = np.divmod(positions, bs)
        longs[2 * count :] = self._table_rows[self._row_index, blocks] * bs + offsets
        np.add(positions, 1, out=self._ints[:count], casting="unsafe")  # context lengths
