#!/usr/bin/env bash
# Carries what workers16.py's `cuda` plan item needs onto a lent GPU machine, one device call
# a chunk (each under the 64 MiB a call carries), and puts it together there.
#   here:   .venv/bin/python benchmarks/device/make_payload.py --cuda   (.dev16, .gpuw0..N)
#   there:  bash benchmarks/device/cuda.sh carry K   (K = 0..N, carrying .gpuwK; the last one
#           checks the sum and unpacks: the onnxruntime-gpu wheel into /tmp/site-gpu, embed in
#           fp16 into /tmp/payw/embed)
# Calls must follow each other within the machine's idle release (30 s), or it is given back
# and what was carried is lost. Then, carrying .dev16:
#   ... && PLAN="cuda:1,2,4" bash .dev16/run.sh    (workers16.py reads /tmp/site-gpu, /tmp/payw)
set -euo pipefail
cd "$(dirname "$0")/../.."

carry() {
    mkdir -p /tmp/partsw && cp ".gpuw$1/c$1" /tmp/partsw/
    if [ -f ".gpuw$1/payload.sha256" ]; then
        cat $(ls /tmp/partsw/c* | sort -V) >/tmp/payw.tar
        [ "$(sha256sum /tmp/payw.tar | cut -c1-64)" = "$(cat ".gpuw$1/payload.sha256")" ] ||
            { echo "the chunks do not make the payload: carry them again" >&2; exit 1; }
        rm -rf /tmp/payw && mkdir -p /tmp/payw && tar xf /tmp/payw.tar -C /tmp/payw
        rm -f /tmp/payw.tar /tmp/partsw/c*
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target /tmp/site-gpu /tmp/payw/wheel/*.whl
    fi
    ls -la /tmp/partsw /tmp/payw 2>/dev/null || true
}

case "${1:-}" in
    carry) carry "$2" ;;
    *) echo "usage: $0 carry K" >&2; exit 2 ;;
esac
