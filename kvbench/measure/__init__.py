"""Memory probes: process RSS, torch.cuda.memory_stats, NVML."""
