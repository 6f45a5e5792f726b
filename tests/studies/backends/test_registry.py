"""The backend registry: each engine to its backend by the run's kind, needs checked before anything loads, and a
new backend that is one module plus one registration (here, one registered in the test) running end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvbench.cli import main
from kvbench.commands import sweep_cmd  # noqa: F401  (defined before a test registers a backend, as a user's is)
from kvbench.engine.load_pattern import Load
from kvbench.errors import KvbenchError
from kvbench.studies.backends import registry
from kvbench.studies.backends.base import BackendSetup, BackendSpec, BuildContext, Need, Offer
from kvbench.studies.backends.simulated import SimulatedBackend
from kvbench.studies.run_options import SweepOptions


def test_every_engine_has_one_backend_per_kind_of_run():
    assert registry.engine_names() == ("paged", "contiguous", "vllm")
    for simulated in (False, True):
        plain = SweepOptions(simulate=simulated)  # no --target: the endpoint provider does not select it
        providers = [
            s for s in registry.BACKENDS if s.provides_run and s.simulated == simulated and s.selected_by(plain)
        ]
        assert len(providers) == 1 and set(providers[0].engines) == {"paged", "contiguous"}
    assert len({spec.name for spec in registry.BACKENDS}) == len(registry.BACKENDS)


def test_a_provider_registered_first_takes_the_runs_it_selects(monkeypatch):
    """How an endpoint target will come in: a provider that selects the runs given a target, ahead of kvbench's."""
    remote = BackendSpec(
        name="remote",
        engines=("remote",),
        title="the remote column",
        build=lambda context: None,
        needs=frozenset(),
        offers=frozenset(),
        provides_run=True,
        selected_by=lambda options: options.model.startswith("http://"),
    )
    monkeypatch.setattr(registry, "BACKENDS", (remote, *registry.BACKENDS))
    assert registry.choose_backends(SweepOptions(engines=("remote",), model="http://127.0.0.1:1")).provider is remote
    assert registry.choose_backends(SweepOptions(engines=("paged",))).provider.name == "kvbench"


def test_a_simulated_run_offers_no_live_state_and_needs_no_prompt_tokens():
    simulated = registry.choose_backends(SweepOptions(simulate=True))
    assert simulated.provider.name == "simulator" and simulated.engines_offering(Offer.LIVE_KV) == []
    assert simulated.engines_offering(Offer.KV_MANAGER) == ["paged", "contiguous"]
    assert not simulated.needs_prompt_tokens and simulated.notes() == []
    local = registry.choose_backends(SweepOptions(engines=("contiguous",)))
    assert local.provider.name == "kvbench" and local.engines_offering(Offer.LIVE_KV) == ["contiguous"]
    assert local.needs_prompt_tokens


def test_vllm_joins_with_its_note_and_an_unknown_engine_is_refused(tmp_path, fake_vllm):
    (tmp_path / "config.json").write_text("{}")
    run = registry.choose_backends(SweepOptions(engines=("paged", "vllm"), model=str(tmp_path)))
    assert run.engines_offering(Offer.KV_MANAGER) == ["paged"] and run.engines_offering(Offer.REFERENCE_ONLY) == [
        "vllm"
    ]
    assert len(run.notes()) == 1 and "not a controlled A/B" in run.notes()[0]
    with pytest.raises(KvbenchError, match="unknown engine 'tgi'; choose from paged, contiguous, vllm"):
        registry.choose_backends(SweepOptions(engines=("tgi",)))


def test_a_package_a_backend_needs_is_checked_by_its_need(monkeypatch):
    spec = BackendSpec(
        name="x",
        engines=("x",),
        title="the x column",
        needs=frozenset({Need.PACKAGE}),
        offers=frozenset(),
        build=lambda context: None,
        simulated=True,
        package="kvbench_no_such_package",
        install_hint="install x",
    )
    monkeypatch.setattr(registry, "BACKENDS", (*registry.BACKENDS, spec))
    with pytest.raises(KvbenchError, match="^install x$"):
        registry.choose_backends(SweepOptions(engines=("x",), simulate=True))


class ShadowBackend(SimulatedBackend):
    """A new backend as a newcomer writes it: the simulator's paged manager under another column name, its
    points counted."""

    runs: list[str] = []

    def run(self, engine: str, requests, load: Load, on_step):
        ShadowBackend.runs.append(engine)
        return super().run("paged", requests, load, on_step)


def _build_shadow(context: BuildContext) -> BackendSetup:
    provider = context.provider
    return replace(provider, backend=ShadowBackend(provider.backend.shape, provider.backend.gpu, provider.backend.base))


SHADOW = BackendSpec(
    name="shadow",
    engines=("shadow",),
    title="the shadow column",
    build=_build_shadow,
    simulated=True,
    needs=frozenset({Need.GPU_PRESET}),
    offers=frozenset({Offer.REFERENCE_ONLY}),
    note="shadow: the paged simulator again, as a reference",
)


def test_a_registered_backend_runs_in_a_sweep_with_no_other_change(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(registry, "BACKENDS", (*registry.BACKENDS, SHADOW))
    ShadowBackend.runs.clear()
    out = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--simulate",
                "--requests",
                "30",
                "--concurrency",
                "4,8",
                "--engines",
                "paged,shadow",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "shadow: the paged simulator again" in capsys.readouterr().out
    points = {(p["engine"], p["concurrency"]): p for p in json.loads((out / "summary.json").read_text())["points"]}
    assert ShadowBackend.runs == ["shadow", "shadow"]
    for concurrency in (4, 8):  # the same manager on the same requests: the same figures under another name
        paged, shadow = points[("paged", concurrency)], points[("shadow", concurrency)]
        assert shadow["completed"] == paged["completed"] == 30
        assert shadow["output_throughput"] == paged["output_throughput"]
        assert shadow["kv_peak_allocated_bytes"] == paged["kv_peak_allocated_bytes"]
