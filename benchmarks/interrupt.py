"""How fast a real `kvmatrix run` stops on Ctrl-C, and what it says meanwhile: the run is started as a terminal
would (its own process, SIGINT from outside), its output printed with the seconds since it started; SIGINT is sent
`--after` seconds after the line matching `--at` appeared (default: at once, i.e. during start-up: the canary's
template still importing), then, with `--twice`, a second one a second later. Prints the seconds from the first
SIGINT to the end of the process and its exit status. Without `--at`/`--after` (`--no-interrupt`) the run goes to
its end: a transcript with its start lines and heartbeat.

    PYTHONPATH=. .venv/bin/python benchmarks/interrupt.py [--at REGEX] [--after S] [--twice] [--no-interrupt]
        -- RUN_ARGS...   (e.g. -- --cases-dir mine --runs-dir /tmp/runs)
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", help="send SIGINT once a line matching this appears (default: at the start)")
    parser.add_argument("--after", type=float, default=0.0, help="seconds after --at (or the start)")
    parser.add_argument("--twice", action="store_true", help="a second SIGINT one second after the first")
    parser.add_argument("--no-interrupt", action="store_true", help="let the run end by itself")
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = [sys.executable, "-m", "kvmatrix", "run", *[a for a in args.run_args if a != "--"]]
    started = time.monotonic()
    # As a terminal's foreground job: SIGINT at its default (a job a script started in the background inherits it
    # ignored, and Python then keeps it ignored).
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = threading.Event() if args.at else None
    sent: list[float] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"{time.monotonic() - started:7.1f} | {line}", end="", flush=True)
            if seen is not None and re.search(args.at, line):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not args.no_interrupt:
        while seen is not None and not seen.wait(0.2) and proc.poll() is None:
            pass  # the line never came: the run ended first
        time.sleep(args.after)
        for _ in range(2 if args.twice else 1):
            if proc.poll() is None:
                sent.append(time.monotonic())
                print(f"{sent[-1] - started:7.1f} | >>> SIGINT", flush=True)
                proc.send_signal(signal.SIGINT)
                time.sleep(1.0)
    status = proc.wait()
    reader.join(timeout=5)
    ended = time.monotonic()
    if sent:
        print(f"exit status {status}, {ended - sent[0]:.1f} s after the first SIGINT ({len(sent)} sent)")
    else:
        print(f"exit status {status}, {ended - started:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
