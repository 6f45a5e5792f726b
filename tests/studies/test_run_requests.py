"""The one request resolver of sweep and fleet: each source, what it keeps and drops, and the conflicts."""

from __future__ import annotations

import json

import pytest

from kvbench.errors import KvbenchError
from kvbench.studies.run_requests import RequestChoice, resolve_requests, token_requests
from kvbench.workload.scenario import load_scenario

SPEC = load_scenario("ci-smoke")
MAX_LEN = SPEC.lengths.max_len


def _requests_file(tmp_path, rows):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_a_requests_file_keeps_what_fits_in_its_order_with_its_arrival_times(tmp_path):
    path = _requests_file(
        tmp_path,
        [
            {"prompt_token_ids": [1, 2, 3], "output_len": 4, "arrival_time": 10.0},
            {"prompt_token_ids": [5] * MAX_LEN, "output_len": 2, "arrival_time": 10.5},  # longer than max-len
            {"prompt_token_ids": [7, 8], "output_len": 1, "arrival_time": 12.0},
        ],
    )
    workload, tokenizer = resolve_requests(
        RequestChoice(requests_file=path), SPEC, "tiny", 99, 0, "length", arrivals=True
    )
    assert tokenizer is None and workload.pairs == [(3, 4), (2, 1)]
    assert workload.prompt_ids == [[1, 2, 3], [7, 8]] and workload.arrival_times == [0.0, 2.0]
    assert workload.skipped is not None and workload.skipped.as_dict()["count"] == 1
    assert workload.first(1).pairs == [(3, 4)] and workload.first(1).arrival_times == [0.0]
    closed, _ = resolve_requests(RequestChoice(requests_file=path), SPEC, "tiny", 99, 0, "length")
    assert closed.arrival_times is None and closed.pairs == workload.pairs  # a closed loop reads no times
    workload.check_vocabulary(9)
    with pytest.raises(KvbenchError, match=r"requests.jsonl: a prompt token id is outside the model's vocabulary of 8"):
        workload.check_vocabulary(8)


def test_a_trace_gives_lengths_and_the_scenario_draws_with_the_seed(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len,arrival_time\n10,5,1.5\n12,6,2.0\n", encoding="utf-8")
    workload, _ = resolve_requests(RequestChoice(trace=trace), SPEC, "tiny", 99, 0, "length", arrivals=True)
    assert workload.pairs == [(10, 5), (12, 6)] and workload.prompt_ids is None
    assert workload.arrival_times == [0.0, 0.5] and workload.source == trace
    drawn, _ = resolve_requests(RequestChoice(), SPEC, "tiny", 7, 3, "eos")
    assert drawn.pairs == SPEC.lengths.sample(7, 3) and drawn.stop == "eos" and drawn.source is None


def test_the_shipped_dataset_is_counted_without_a_tokenizer_for_a_preset():
    workload, tokenizer = resolve_requests(RequestChoice(dataset="real-chat"), SPEC, "tiny", 5, 0, "length")
    assert tokenizer is None and len(workload.pairs) == 5 and workload.dataset is not None
    assert workload.prompt_ids is None and workload.source == workload.dataset.path


@pytest.mark.parametrize(
    "choice, message",
    [
        (RequestChoice(requests_file="r.jsonl", trace="t.csv"), "a requests file and a trace both give the requests"),
        (RequestChoice(requests_file="r.jsonl", dataset="real-chat"), "a dataset and a requests file both give"),
        (RequestChoice(trace="t.csv", dataset="real-chat"), "a dataset and a trace both give the requests"),
    ],
)
def test_two_sources_at_once_are_refused(choice, message):
    with pytest.raises(KvbenchError, match=message):
        resolve_requests(choice, SPEC, "tiny", 5, 0, "length")


def test_token_requests_are_seeded_greedy_and_ignore_eos():
    first, again = token_requests([(4, 2), (3, 1)], 50, 1), token_requests([(4, 2), (3, 1)], 50, 1)
    assert [r.prompt_token_ids for r in first] == [r.prompt_token_ids for r in again]
    assert [len(r.prompt_token_ids) for r in first] == [4, 3] and [r.max_tokens for r in first] == [2, 1]
    assert all(r.sampling.ignore_eos and r.sampling.is_greedy for r in first)


def test_a_budget_given_two_ways_is_refused():
    from kvbench.errors import KvbenchError
    from kvbench.workload.scenario import parse_scenario

    with pytest.raises(KvbenchError, match=r"\[budget\] gives slots and model, gpu: the slots set the pool"):
        parse_scenario({"budget": {"slots": 100, "model": "llama-2-13b", "gpu": "a100-80g"}}, "mixed")
