#!/usr/bin/env bash
# The whole default matrix on one GPU (an H100 or an H200: the class nvidia-smi names), timed: the cold run (a
# fresh machine, empty caches), in calls of at most 10 minutes that resume it, then the warm run (the same machine
# right after, caches kept). Run from the repository root with a staged vLLM; what must come back goes to $OUT.
#
#   bash benchmarks/h200_matrix.sh cold /tmp/vllm-0.34.0   # one call of at most ~9.8 min; if its summary says
#                                                          # cells are left, the same command resumes the run
#   bash benchmarks/h200_matrix.sh warm /tmp/vllm-0.34.0   # the next call, on the same machine (~4-5 min)
#
# The run gets what is left of CALL_S (default 590: the whole call) once the reports' REPORT_S (default 60) are
# kept aside, or LIMIT_S if that is less. The cold run starts on empty caches, its cells ordered by REFERENCE's
# walls and backends (as a nightly's history orders them; SEED=none: the cases' order); both runs' verdicts are
# compared with REFERENCE's, judged again under this checkout's cases and waivers (default: the H200's vLLM 0.34.0
# run of tests/fixtures/runs/). The goal: cold 480 s, warm 240 s (the walls of the calls' `kvmatrix run`).
# GPU (default: from nvidia-smi), EXTRA_PYTHONPATH (lm-eval's folder, where carried apart), RUN_ARGS (e.g.
# "--case ct-llama"), ROOT and PYTHON try the script elsewhere.
# $OUT receives: RUN.log (the run's output), summary.txt (one line a call), phases.txt (h200_phases.py: the
# reference, cold and warm side by side, with the verdict differences), RUN-scaling.txt (h200_scaling.py),
# RUN.tar.xz (the run folder: records and cell logs).
set -u
run=${1:?cold or warm}
vllm=${2:?the staged vLLM folder}
case $run in cold|warm) ;; *) echo "cold or warm, not $run" >&2; exit 2 ;; esac
call_started=$(date +%s)
root=${ROOT:-/tmp/kvm-h200-matrix}
py=${PYTHON:-python3}
runs=$root/runs
cache=$root/cache
before=$root/before  # the reference, judged again under today's cases
reference=${REFERENCE:-tests/fixtures/runs/h200-vllm-0.34.0-2026-12-04.tar.xz:cold}
export PYTHONPATH=$vllm:$vllm/nvidia_cutlass_dsl/dsl_packages:$PWD${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  # Every process would compile torch and vLLM from source again (as the Makefile explains): keep the bytecode.
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX=$root/pycache
fi
mkdir -p "$runs" "$OUT"
log=$OUT/$run.log
if [ "$run" = warm ] && [ ! -e "$runs/cold" ]; then
  echo "no cold run in $runs on this machine: the warm run needs its caches" >&2
  exit 2
fi
calls=$root/$run.calls
if [ "$run" = cold ] && [ ! -e "$runs/cold" ]; then
  rm -rf "$cache" "$calls"  # a cold run starts on empty caches; a resumed one keeps what its first call compiled
fi
gpu=${GPU:-$("$py" benchmarks/gpu_matrix_call.py class "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)")}
memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
slots=$("$py" benchmarks/gpu_matrix_call.py slots "$gpu" "${memory:-81559}" "$(nproc)")
{ nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1; echo "class $gpu, $slots slots"; } >> "$log"
"$py" benchmarks/gpu_matrix_call.py reference "$reference" "$before" >> "$log" 2>&1
if [ "$run" = cold ] && [ ! -s "$calls" ] && [ "${SEED:-}" != none ]; then
  "$py" benchmarks/gpu_matrix_call.py seed "$before" "$cache" "$gpu" >> "$log" 2>&1
fi
spent=$(( $(date +%s) - call_started ))
limit=$(( ${CALL_S:-590} - ${REPORT_S:-60} - spent ))
[ -n "${LIMIT_S:-}" ] && [ "$LIMIT_S" -lt "$limit" ] && limit=$LIMIT_S
echo "kvmatrix run for at most $limit s" >> "$log"
started=$(date +%s)
# SIGTERM at the limit: the harness kills its cells and keeps every finished record, so the same command resumes.
# shellcheck disable=SC2086  # RUN_ARGS is words
timeout -k 20 "$limit" "$py" -m kvmatrix run --gpu "$gpu" --run-id "$run" --runs-dir "$runs" \
  --cache-dir "$cache" --db "$root/no-history.sqlite" ${RUN_ARGS:-} >> "$log" 2>&1
code=$?
echo $(( $(date +%s) - started )) >> "$calls"
echo "kvmatrix run exited $code after $(( $(date +%s) - started )) s" >> "$log"
du -sh "$cache"/* >> "$log" 2>&1  # which JIT caches the run filled (kept for the warm run)
goal=480; [ "$run" = warm ] && goal=240
# shellcheck disable=SC2046  # one number a call
"$py" benchmarks/gpu_matrix_call.py summary "$runs/$run" "$before" "$goal" $(cat "$calls") >> "$OUT/summary.txt" 2>&1
tar -cf - -C "$runs" "$run" | xz -T0 > "$OUT/$run.tar.xz"
done_runs=$(for r in cold warm; do [ -e "$runs/$r" ] && printf '%s ' "$runs/$r"; done)
# shellcheck disable=SC2086  # the runs are words
"$py" benchmarks/h200_phases.py "$before" $done_runs --same-as "$before" > "$OUT/phases.txt" 2>&1
"$py" benchmarks/h200_scaling.py "$runs/$run" --slots-per-gpu "$slots" > "$OUT/$run-scaling.txt" 2>&1
tail -n 2 "$log"
tail -n 1 "$OUT/summary.txt"
echo "call took $(( $(date +%s) - call_started )) s"
