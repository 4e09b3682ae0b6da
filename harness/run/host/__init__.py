"""The host's accounting: its slots and what each sees of the cores and GPUs (slots.py), the GPUs' memory
before and after each cell (gpu_memory.py, gpu_check.py), the CPU time a run used (host_cpu.py)."""
