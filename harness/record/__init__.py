"""What a cell's record is and where it lives: its types (types.py: the phases `CellOutput`, `OutcomeRecord` and
`JudgedRecord`) and parts (parts.py, with the verdict vocabulary), the files of a run (files.py: record files,
`RunDir`), one cell on one GPU class (task.py) and where kvmatrix and its caches are (paths.py). Below everything
else of the harness: it needs only matrix/."""
