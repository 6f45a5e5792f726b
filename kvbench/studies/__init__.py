"""Studies: what a command measures, built on the engines (sweep, waste, share), between commands and engine."""
