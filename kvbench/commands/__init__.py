"""CLI command modules. Each module defines ``register(app)``; ``kvbench.cli`` discovers them all."""
