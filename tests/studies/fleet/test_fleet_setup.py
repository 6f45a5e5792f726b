"""A fleet's requests: a dataset (asked for, or the scenario's) gives the lengths, arrivals stay Poisson."""

from __future__ import annotations

import pytest

from kvbench.errors import KvbenchError
from kvbench.studies.fleet.fleet_setup import FleetOptions, FleetSetup
from kvbench.workload.dataset import TokenCounter, sample_dataset


def _dataset_pairs(count: int, seed: int, max_len: int) -> list[tuple[int, int]]:
    return sample_dataset("real-chat", TokenCounter(), max_len, count, seed).pairs


def test_a_dataset_gives_the_lengths_and_poisson_the_arrivals():
    setup = FleetSetup.resolve(
        FleetOptions(scenario="ci-smoke", dataset="real-chat", rate=4.0, requests=20, simulate=True)
    )
    assert setup.pairs == _dataset_pairs(20, setup.seed, setup.config.max_len)
    assert setup.dataset is not None and setup.dataset.total == 52
    assert setup.meta()["dataset"]["requests"] == 20 and setup.meta()["stop"] == "length"
    assert setup.arrival_source.startswith("Poisson at 4 req/s")


def test_the_scenarios_dataset_is_honoured():
    setup = FleetSetup.resolve(FleetOptions(scenario="real-chat", rate=2.0, simulate=True))
    assert setup.dataset is not None and setup.dataset.path.name == "real-chat.json"
    assert setup.pairs == _dataset_pairs(setup.spec.requests, setup.seed, setup.config.max_len)


def test_the_tensor_fleet_gets_prompts_of_the_dataset_lengths():
    setup = FleetSetup.resolve(FleetOptions(scenario="real-chat", rate=2.0, requests=5))
    assert [len(ids) for ids in setup.prompts] == [p for p, _ in setup.pairs]
    assert setup.pairs == _dataset_pairs(5, setup.seed, setup.config.max_len)


def test_a_requests_file_replaces_the_scenarios_dataset(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len\n10,5\n12,6\n")
    setup = FleetSetup.resolve(FleetOptions(scenario="real-chat", trace=trace, rate=1.0, simulate=True))
    assert setup.dataset is None and setup.pairs == [(10, 5), (12, 6)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trace": "trace.csv"}, "a dataset and a trace both give the requests: choose one"),
        ({"prefix_groups": 2, "prefix_len": 8}, "a dataset brings its own prompts"),
    ],
)
def test_a_dataset_excludes_other_request_sources(tmp_path, changes, message):
    (tmp_path / "trace.csv").write_text("prompt_len,output_len\n10,5\n")
    changes = {k: tmp_path / v if k == "trace" else v for k, v in changes.items()}
    with pytest.raises(KvbenchError, match=message):
        FleetSetup.resolve(FleetOptions(scenario="ci-smoke", dataset="real-chat", rate=1.0, simulate=True, **changes))
