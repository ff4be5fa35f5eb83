#!/usr/bin/env bash
# `queryserve serve --workers N` scaling, time-bounded (see workers16.py's docstring).
# From the repository root, after the wheels are on PYTHONPATH:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --target /tmp/site .dev16/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD/src
#   bash .dev16/run.sh
# Results: $OUT/workers16.json (rewritten after each run), $OUT/steps.jsonl (every trial),
# $OUT/servers.log (each server log's tail), $OUT/run.log (this output).
set -u
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/workers16-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:-$PWD/src}"
PY="${PY:-python3}"
# The driver stops at DEADLINE_S (185 s by default) and cleans up; this is the backstop.
timeout -k 5 "${HARD_S:-200}" "$PY" .dev16/workers16.py 2>&1 | tee "$OUT/run.log"
echo "exit ${PIPESTATUS[0]}"
