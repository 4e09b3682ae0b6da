"""What a run is doing, said while it runs: a line as each cell starts, and a heartbeat after `every` seconds
without a line, naming each cell running now with the phase its cell process last wrote in its result file (the
cell rewrites it as each phase starts: harness/cell/main.py) and how long the cell has been running. Before its
process wrote a phase a cell is `starting` (a process start or fork, a template's imports, a model build). A
compiled cell is silent for a minute or more on a 2-core CPU: the heartbeat says it is in its engine start, not
hung."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.resume import OnRecord

HEARTBEAT_S = 15.0
# The cell process's phases (harness/cell/main.py: PHASE_TIMINGS, and "done") as the heartbeat names them.
PHASE_WORDS = {"import": "importing vLLM", "init": "engine start", "probe": "probing layers", "generate": "generating",
               "forced": "teacher-forced decode", "references": "references", "accuracy": "accuracy",
               "done": "ending"}
# Before the cell's process wrote a phase: its process start or fork (a template still importing vLLM), a model build.
STARTING = "starting: process, imports"
ResultFile = Callable[[Task], Path]  # where a task's cell process writes its result (and phase)


class Activity:
    """The cells running now, for the run's start lines and heartbeat; `say` prints a line, `started` is the run's
    start (monotonic), `result_file` where a running cell's process writes its phase."""

    def __init__(self, say: Callable[[str], None], started: float, result_file: ResultFile, total: int = 0,
                 every: float = HEARTBEAT_S) -> None:
        self.say, self.started, self.result_file, self.every = say, started, result_file, every
        self._running: dict[str, tuple[Task, float]] = {}
        self._lock = threading.Lock()
        self._last_line = time.monotonic()
        self.done, self.total = 0, total

    def _line(self, text: str) -> None:
        with self._lock:
            self._last_line = time.monotonic()
        self.say(f"[{self.done:>3}/{self.total} {time.monotonic() - self.started:7.1f} s] {text}")

    @contextmanager
    def running(self, task: Task) -> Iterator[None]:
        """A cell's process is starting (the executor wraps the cell's run in it)."""
        with self._lock:
            self._running[task.key] = (task, time.monotonic())
        self._line(f"start {task.cell.cell_id} @{task.gpu_name}")
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(task.key, None)

    def on_record(self, show: OnRecord) -> OnRecord:
        """`show` (a progress line per finished cell), counting what is done for the other lines."""
        def shown(record: JudgedRecord, done: int, total: int, resumed: bool) -> None:
            self.done, self.total = done, total
            with self._lock:
                self._last_line = time.monotonic()
            show(record, done, total, resumed)
        return shown

    def phase(self, task: Task) -> str:
        try:
            phase = json.loads(self.result_file(task).read_text()).get("phase")
        except (OSError, ValueError, AttributeError):  # not written yet (or being replaced)
            phase = None
        return PHASE_WORDS.get(phase, phase) if phase else STARTING

    def heartbeat_line(self) -> str | None:
        """The cells running now, each with its phase and seconds; None when none runs."""
        with self._lock:
            running = sorted(self._running.values(), key=lambda item: item[1])
        if not running:
            return None
        now = time.monotonic()
        return "running " + ", ".join(f"{task.cell.cell_id} ({self.phase(task)}, {now - since:.0f} s)"
                                      for task, since in running)

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        """A thread that says heartbeat_line after each `every` seconds without a line, while the block runs."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(1.0):
                with self._lock:
                    quiet = time.monotonic() - self._last_line
                if quiet >= self.every and (line := self.heartbeat_line()):
                    self._line(line)

        thread = threading.Thread(target=beat, name="kvmatrix-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2.0)
