"""``kvbench scenarios``: the built-in scenarios a run can name."""

from __future__ import annotations

import typer

from kvbench.commands._options import make_console


def scenarios() -> None:
    """List the built-in scenarios with a one-line description."""
    from kvbench.report.sweep_report import scenarios_table
    from kvbench.workload.scenario import builtin_scenarios, load_scenario

    make_console().print(scenarios_table({name: load_scenario(name) for name in sorted(builtin_scenarios())}))


def register(app: typer.Typer) -> None:
    app.command("scenarios")(scenarios)
