"""Scenario files (TOML), installed as ``kvbench.scenarios``."""
