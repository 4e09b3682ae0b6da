"""The default case set. A package only so that an installed kvmatrix ships these files and finds them through
importlib.resources (matrix/load.py's CASES_DIR); nothing here is imported."""
