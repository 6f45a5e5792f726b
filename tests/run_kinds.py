"""The session fixtures of tests/report/html/conftest.py that hold one run of each kind, for the tests that open
every kind's page."""

RUN_KINDS = [
    "sweep_run",
    "oom_sweep_run",
    "waste_run",
    "fleet_run",
    "share_run",
    "dataset_run",
    "reuse_run",
    "endpoint_run",
]
