"""Model shapes (presets and local config.json) and the Llama-family runner."""
