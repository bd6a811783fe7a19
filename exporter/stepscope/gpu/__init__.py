"""GPU sources: the NVML backend (real GPUs) and its simulated twin."""
