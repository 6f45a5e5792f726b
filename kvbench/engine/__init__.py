"""Requests, the scheduler shared by the tensor engine and the simulator, and the engines' step loops."""
