"""The host's accounting: its slots and what each sees of the cores and GPUs (slots.py), the GPUs' memory
(gpu_memory.py; the check after each cell, which needs the cells' process groups, is process/gpu_check.py), the
CPU time a run used (host_cpu.py). Nothing here imports process/: the host is below the processes on it."""
