"""The exit statuses of every `kvmatrix` command, in one place."""

OK = 0
FAILED = 1  # a cell failed or errored, a waiver problem, a new failure, a stale file: the command's own verdict
USAGE = 2  # the command could not do what was asked: bad case files, a selection of no cell, a refused folder
INTERRUPTED = 130  # Ctrl-C or SIGINT (a CI step's time limit): every finished cell's record is kept
TERMINATED = 143  # SIGTERM (128 + 15): the same, said so
BROKEN_PIPE = 141  # the reader of the output went away (`kvmatrix models | head`): as SIGPIPE (128 + 13) ends a tool
