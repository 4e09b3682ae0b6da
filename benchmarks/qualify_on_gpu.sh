#!/usr/bin/env bash
# `kvmatrix qualify` on a GPU machine where the new vLLM release is staged as a folder (/tmp/vllm-$NEW, as the
# staging script leaves it) and the old one is a stored run; what must come back is written to $OUT, two files:
#   qualification.md   the report, to read at once;
#   qualify.tar.xz     qualify/ (qualification.md, .html, .json; findings/: each finding's script, its issue draft,
#                      its log, status.json and board.md) and new-run/ (the new release's records, *.json only).
# From the repository root:
#   NEW=0.34.0 OLD_RUN=<run folder | ARCHIVE.tar.xz:FOLDER> [NEW_RUN=<run folder>] [GPU=H200] [JOBS=8] \
#   [SCRIPT_JOBS=12] [SCRIPT_TIMEOUT=420] [QUALIFY_ARGS=...] [NEW_ENV=<env spec>] [PYTHON=python3] \
#   bash benchmarks/qualify_on_gpu.sh
# Without NEW_RUN the new release's matrix runs here first (`kvmatrix run --gpu $GPU --jobs $JOBS`, resumable).
set -uo pipefail

: "${NEW:?the new release, e.g. 0.34.0}" "${OLD_RUN:?a stored run of the old release}" "${OUT:?the folder to fill}"
GPU=${GPU:-H200}
JOBS=${JOBS:-8}
STAGED=/tmp/vllm-$NEW
if [ -z "${NEW_ENV:-}" ]; then
  NEW_ENV=$STAGED
  # cutlass reaches sys.path through a .pth file, which Python reads in site directories only
  [ -d "$STAGED/nvidia_cutlass_dsl/dsl_packages" ] && NEW_ENV=$STAGED:$STAGED/nvidia_cutlass_dsl/dsl_packages
fi
WORK=${WORK:-/tmp/kvmatrix-qualify-$NEW}
mkdir -p "$WORK" "$OUT"

# shellcheck disable=SC2086  # QUALIFY_ARGS is a list of options
"${PYTHON:-python3}" -m kvmatrix qualify --gpu "$GPU" --jobs "$JOBS" --script-jobs "${SCRIPT_JOBS:-12}" \
  --script-timeout "${SCRIPT_TIMEOUT:-420}" --old-run "$OLD_RUN" ${NEW_RUN:+--new-run "$NEW_RUN"} \
  --env "$NEW=$NEW_ENV" --out "$WORK/qualify" ${QUALIFY_ARGS:-}
status=$?

new_run=${NEW_RUN:-$WORK/qualify/runs/qualify-vllm$NEW}
mkdir -p "$WORK/new-run"
find "$new_run" -maxdepth 1 -name '*.json' -exec cp {} "$WORK/new-run/" \;
cp "$WORK/qualify/qualification.md" "$OUT/" 2>/dev/null
tar cJf "$OUT/qualify.tar.xz" -C "$WORK" --exclude='runs' --exclude='stored' --exclude='bisect-*' qualify new-run
echo "kvmatrix qualify exited $status; $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$status"
