"""A sweep point's blocks over time, typed: the timeline file written and read back unchanged."""

from __future__ import annotations

import json

import pytest

from kvbench.results.block_timeline import BlockTimeline


def test_the_timeline_file_round_trips_byte_for_byte():
    written = '{"engine": "paged", "concurrency": 10, "total_blocks": 64, "time_s_blocks": [[0.0, 1], [0.5, 7]]}'
    timeline = BlockTimeline.from_json(json.loads(written))
    assert json.dumps(timeline.to_json()) == written
    assert timeline.times == [0.0, 0.5] and timeline.blocks == [1, 7] and timeline.total_blocks == 64


def test_a_timeline_without_its_names_still_reads_and_one_without_blocks_is_refused():
    timeline = BlockTimeline.from_json({"total_blocks": 8, "time_s_blocks": []})
    assert (timeline.engine, timeline.concurrency, timeline.times) == ("", 0, [])
    with pytest.raises(KeyError):
        BlockTimeline.from_json({"engine": "paged"})
