"""A vLLM release in a test, as `kvmatrix qualify` and `kvmatrix bisect` reach one through `--env REF="PYTHON
tests/fake_release.py VERSION RECORDS"` (a command prefix ending in an interpreter): it answers the version probe
with VERSION and runs a bisection step (`-m kvmatrix.harness.bisect.cell REQUEST`) by handing back the records a
real release wrote in RECORDS (`<class>--<cell id>.json`), never running vLLM. A cell RECORDS lacks is one this
release cannot express (a step's skip)."""

import json
import shutil
import sys
from pathlib import Path

version, records, *args = sys.argv[1:]
if "-c" in args:  # the version probe: python -I -c "import importlib.metadata as m; print(m.version(...))"
    print(version)
    sys.exit(0)
request = json.loads(Path(args[-1]).read_text())
run_dir = Path(request["runs_dir"]) / request["run_id"]
run_dir.mkdir(parents=True, exist_ok=True)
answer: dict = {"records": {}, "skips": {}}
for cell in request["cells"]:
    stored = Path(records) / f"{request['gpu']}--{cell}.json"
    if stored.is_file():
        answer["records"][cell] = str(shutil.copy(stored, run_dir / stored.name))
    else:
        answer["skips"][cell] = f"{version} has no record of {cell}"
Path(request["out"]).write_text(json.dumps(answer))
