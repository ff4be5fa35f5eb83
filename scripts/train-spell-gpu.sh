#!/usr/bin/env bash
# The hybrid's two seq2seq models retrained on one GPU, in one go: the development model (it
# never sees the development split; the re-ranker is fitted on its scores) and the served one,
# side by side, each with the committed recipe (`models/spell/TRAINING.json`: 5.5 minutes,
# fp32, batch 512, learning rate 1e-3, d_model 192, 7 example writers each) and ARGS.
# Issue 43, item 3: ARGS `--copy-share 0.1` trains seq2seqs that copy words they do not know.
# Each run is `queryserve train spell`; this script only schedules them. Two runs at once each
# kept ~19,000 examples/s on one H200 (2026-11-26), as one did alone.
#
# usage: scripts/train-spell-gpu.sh OUT [ARGS...]
#   OUT   development/ and served/ (Hugging Face folders with TRAINING.json), their logs
#   ARGS  given to both runs last (a quick try on a CPU: --device cpu --workers 0 --minutes 0.2)
# environment: MINUTES (5.5), WORKERS (7), PYTHON (python3).
#
# Then, on any machine (2 cores: ~2 minutes to convert, ~3 to fit, ~8 to evaluate):
#   for m in development served; do
#     queryserve optimize OUT/$m --task seq2seq --precision fp32 --out OUT/$m-ct2; done
#   queryserve train spell-hybrid OUT/hybrid --development-seq2seq OUT/development-ct2 \
#     --seq2seq OUT/served-ct2
#   queryserve eval spell OUT/hybrid model_repository/spell-hybrid --min-score 0.82 \
#     --curves OUT/curves.png
set -euo pipefail
[ $# -ge 1 ] || { sed -n '10,13p' "$0"; exit 2; }
out=$1
shift
extra=("$@")
python=${PYTHON:-python3}
mkdir -p "$out"

for run in development served; do
    flag=(); [ $run = development ] && flag=(--development)
    "$python" -m queryserve train spell "$out/$run" "${flag[@]}" --minutes "${MINUTES:-5.5}" \
        --batch-size 512 --learning-rate 1e-3 --fp32 --d-model 192 --device cuda \
        --workers "${WORKERS:-7}" "${extra[@]}" >"$out/$run.log" 2>&1 &
done
failed=0
for pid in $(jobs -p); do wait "$pid" || failed=1; done
for run in development served; do
    [ -f "$out/$run/TRAINING.json" ] || { echo "failed: $out/$run (see $run.log)" >&2; failed=1; }
done
[ $failed = 0 ] || exit 1
# The checkpoint (optimizer state, 3x the model) is not needed to serve or to compare.
rm -f "$out"/*/checkpoint.pt
echo "done: $(date -u +%T)"
