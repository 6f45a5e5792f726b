"""The watch timeline: append-safe JSONL, read back into windows, diagnosed; bad files are one-line errors."""

from __future__ import annotations

import json

import pytest

from kvbench.errors import KvbenchError
from kvbench.report.diagnose import Thresholds, diagnose_timeline, read_states, read_timeline, timeline_path
from kvbench.report.diagnose.watch_timeline import during
from kvbench.results.watch_records import append_records, error_record, header_record, sample_records


def write(path, vllm_exposition, steps) -> None:
    append_records(path, [header_record("http://127.0.0.1:8000/metrics", 1.0)])
    for elapsed, values in steps:
        append_records(
            path, sample_records(elapsed, "http://127.0.0.1:8000/metrics", read_states(vllm_exposition(**values)))
        )


def test_a_timeline_reads_back_and_is_diagnosed(tmp_path, vllm_exposition):
    path = tmp_path / "timeline.jsonl"
    write(
        path,
        vllm_exposition,
        [(t, dict(usage=0.2, waiting=w, waiting_capacity=w)) for t, w in ((0.0, 0), (1.0, 4), (2.0, 9))],
    )
    append_records(path, [error_record(3.0, "http://127.0.0.1:8000/metrics", "cannot scrape: timed out")])
    timeline = read_timeline(path)
    (window,) = timeline.windows.values()
    assert len(window.samples) == 3 and timeline.errors == 1 and timeline.url.endswith(":8000/metrics")
    diagnosis = diagnose_timeline(path, Thresholds())
    assert diagnosis.fired and diagnosis.findings[0].rule == "concurrency_capped"
    assert any("1 scrape(s) failed" in note for note in diagnosis.notes)
    assert timeline_path(tmp_path) == path and timeline_path(path) == path
    (tmp_path / "summary.json").write_text("{}")
    assert timeline_path(tmp_path) is None  # a run directory is diagnosed as a run


def test_a_torn_last_line_is_set_aside(tmp_path, vllm_exposition):
    path = tmp_path / "timeline.jsonl"
    write(path, vllm_exposition, [(0.0, {}), (1.0, {})])
    path.write_text(path.read_text() + '{"elapsed_s": 2.0, "state": {"fam')  # killed while writing
    diagnosis = diagnose_timeline(path, Thresholds())
    assert any("cut short" in note for note in diagnosis.notes)
    assert len(read_timeline(path).windows["vLLM engine=0 model_name=smollm2-135m-instruct-hf"].samples) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"schema_version": 1,\n "points": []}\n', "not valid JSON"),
        ("not json at all\n", "not valid JSON"),
        ('{"elapsed_s": 0, "state": {"family": "vllm"}}\n', "not a timeline record"),
        ('{"elapsed_s": "soon", "state": {}}\n{"kind": "kvbench-watch"}\n', "not a timeline record"),
        ("[1, 2]\n", "not a timeline record"),
        ('{"elapsed_s": 0, "state": [1, 2]}\n', "not a timeline record"),  # a state that is no object
        ('{"elapsed_s": NaN, "state": {}}\n{"kind": "kvbench-watch"}\n', "not a finite number of seconds"),
        ('{"elapsed_s": 1e300, "state": {}}\n{"kind": "kvbench-watch"}\n', "not a finite number of seconds"),
        ('{"kind": "kvbench-watch", "version": 1}\n', "holds no scrapes"),
        ("", "holds no scrapes"),
    ],
)
def test_a_file_that_is_not_a_timeline_is_a_one_line_error(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(KvbenchError, match=message) as err:
        read_timeline(path)
    assert len(str(err.value).splitlines()) == 1


def test_a_broken_line_before_the_last_is_an_error(tmp_path, vllm_exposition):
    path = tmp_path / "timeline.jsonl"
    write(path, vllm_exposition, [(0.0, {})])
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{broken", lines[1]]) + "\n")
    with pytest.raises(KvbenchError, match=r"timeline.jsonl:2: not valid JSON"):
        read_timeline(path)
    with pytest.raises(KvbenchError, match="no such timeline"):
        read_timeline(tmp_path / "missing.jsonl")
    assert json.loads(lines[1])["state"]["family"] == "vllm"


def test_a_load_window_reads_the_server_under_load_not_idle_after_it(tmp_path, vllm_exposition):
    """A sweep point's scrapes go on after its load ends; judged over the load, the queue it built is seen."""
    path = tmp_path / "watch-local-c4.jsonl"
    steps = [(-0.5, 0), (0.0, 4), (1.0, 9), (2.0, 9), (2.5, 0), (3.0, 0)]  # load from 0 to 2.2 s, idle after
    write(path, vllm_exposition, [(t, dict(usage=0.2, waiting=w, waiting_capacity=w)) for t, w in steps])
    under_load = diagnose_timeline(path, Thresholds(), (0.0, 2.2))
    assert under_load.fired and under_load.findings[0].rule == "concurrency_capped"
    assert not diagnose_timeline(path, Thresholds()).fired  # the last scrape, after the load, sees no queue
    (window,) = read_timeline(path).windows.values()
    trimmed = during(window, 0.0, 2.2)
    assert trimmed is not None and [t for t, _ in trimmed.samples] == [-0.5, 0.0, 1.0, 2.0]
    assert during(window, 10.0, 11.0) is None  # no scrape inside: the caller keeps the whole timeline


def test_a_timeline_whose_time_goes_back_is_a_one_line_error(tmp_path, vllm_exposition):
    path = tmp_path / "timeline.jsonl"
    write(path, vllm_exposition, [(10.0, {}), (9.0, {}), (11.0, {})])  # "over -4.0 s" was printed from this
    with pytest.raises(KvbenchError, match="elapsed_s goes back from 10 to 9") as err:
        read_timeline(path)
    assert len(str(err.value).splitlines()) == 1
