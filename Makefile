# The checks CI runs (.ci/run calls `make lint baseline` after the README's test command), runnable by hand in
# the project's venv: `make check` before a push. PYTHON picks the interpreter (default: python3 on PATH), OUT
# where the baseline runs are written (default: a new temporary folder).
PYTHON ?= python3

.PHONY: check lint test baseline

check: lint test baseline

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy kvbench

test:
	$(PYTHON) -m pytest -q

# The deterministic regression check against reports/baseline/ (simulator and seeded workloads, ratios in-run).
# Refresh on purpose with the same runs and `kvbench compare BASE HEAD --update-baseline`.
baseline:
	set -e; out=$${OUT:-$$(mktemp -d)}; \
	$(PYTHON) -m kvbench.cli waste --requests 300 --block-size 8,16,32 --out "$$out/waste" --json > /dev/null; \
	$(PYTHON) -m kvbench.cli sweep --simulate --requests 300 --out "$$out/sweep" --json > /dev/null; \
	$(PYTHON) -m kvbench.cli compare reports/baseline/waste "$$out/waste"; \
	$(PYTHON) -m kvbench.cli compare reports/baseline/sweep "$$out/sweep"
