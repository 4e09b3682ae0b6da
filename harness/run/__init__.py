"""Running cells: the session (class, folders, models), the task model, each cell's process and environment,
its GPU's memory check, the order cells start in, the guards before a run, and the pools that run tasks (this
machine's slots, or a Ray cluster) behind one protocol."""
