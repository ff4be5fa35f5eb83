"""The quantization sweep behind the default encoder's recipe (exploration, kept to reproduce it).

Builds every recipe tried for all-MiniLM-L6-v2 (dynamic, per-channel, partial, SmoothQuant,
static QDQ, MatMulNBits, fp16, bf16), gates each against sentence-transformers on 512 MASSIVE
test queries at batch 1/32/64 (and reports batch 128), then times all of them side by side in
interleaved rounds. The MatMulNBits rows need `pip install onnx-ir`.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/quantization_sweep.py OUT_DIR [SECONDS] [ROUNDS]

Results: OUT_DIR/sweep.json and a table on stdout (BENCHMARKS.md quotes one run).
"""
# ruff: noqa
import json, statistics, sys, time, traceback
from pathlib import Path
import numpy as np, onnx
from onnx import helper as h, TensorProto as T
from onnxruntime.quantization import (quantize_dynamic, quantize_static, QuantType, QuantFormat,
                                      CalibrationDataReader, CalibrationMethod)
from queryserve.optimize import candidates as C
from queryserve.optimize import encoder as E
from queryserve.optimize import recipes as R
from queryserve.optimize.source import minilm_folder
from queryserve.prepare import read_utterances

OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
SECS = float(sys.argv[2]) if len(sys.argv) > 2 else 1.5
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
HF = minilm_folder(); TOKP = HF / "tokenizer.json"
queries = read_utterances(Path("data/massive-en/test.jsonl"), 512)
calib = read_utterances(Path("data/massive-en/train.jsonl"), 512)
tok = C.load_tokenizer(TOKP)
CAL = R.BuildInputs(C.batches(tok, calib, 32, ("input_ids", "attention_mask")))
t0 = time.perf_counter()
def p(name): return OUT / f"{name}.onnx"
def wmm(path):
    m = onnx.load(str(path)); inits = {i.name for i in m.graph.initializer}
    w = [n.name for n in m.graph.node if n.op_type == "MatMul" and any(x in inits for x in n.input)]
    a = [n.name for n in m.graph.node if n.op_type == "MatMul" and not any(x in inits for x in n.input)]
    return w, a
built, errors, recipe = {}, {}, {}
def build(name, desc, fn):
    s = time.perf_counter()
    try:
        fn(); built[name] = p(name); recipe[name] = desc
        print(f"built {name} in {time.perf_counter()-s:.1f}s", flush=True)
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {str(e)[:300]}"; recipe[name] = desc
        print(f"FAILED {name}: {errors[name]}", flush=True)
FP32, FUSED = p("fp32"), p("fp32-fused")
build("fp32", "torch.onnx.export eager attention", lambda: E.export_onnx(HF, FP32))
build("fp32-fused", "ORT transformer fusions opt_level 0", lambda: R.fuse_transformer_ops(FP32, FUSED))
W, A = wmm(FP32); FW, FA = wmm(FUSED)
ffn_out = [n for n in W if n.endswith("/output/dense/MatMul") and "attention" not in n]
ffn = [n for n in W if "intermediate" in n] + ffn_out
attn = [n for n in W if "/attention/" in n]
ffn_out_fused = [n for n in FW if n.endswith("/output/dense/MatMul") and "attention" not in n]
DQ = dict(weight_type=QuantType.QInt8)
build("int8-dyn-naive", "quantize_dynamic QInt8 defaults (per-tensor, incl. Gather)", lambda: quantize_dynamic(FP32, p("int8-dyn-naive"), **DQ))
build("int8-dyn-pc+gather", "dynamic per-channel, default op types (MatMul+Gather)", lambda: quantize_dynamic(FP32, p("int8-dyn-pc+gather"), per_channel=True, **DQ))
build("int8-dyn-pc", "dynamic per-channel, weight MatMuls only", lambda: quantize_dynamic(FP32, p("int8-dyn-pc"), per_channel=True, op_types_to_quantize=["MatMul"], nodes_to_exclude=A, **DQ))
build("int8-dyn-pc-rr", "dynamic per-channel, weight MatMuls, reduce_range", lambda: quantize_dynamic(FP32, p("int8-dyn-pc-rr"), per_channel=True, reduce_range=True, op_types_to_quantize=["MatMul"], nodes_to_exclude=A, **DQ))
build("int8-dyn-pc+gather-rr", "dynamic per-channel MatMul+Gather, reduce_range", lambda: quantize_dynamic(FP32, p("int8-dyn-pc+gather-rr"), per_channel=True, reduce_range=True, **DQ))
build("int8-dyn-pc-ffn-only", "dynamic per-channel, FFN MatMuls only (attention fp32)", lambda: quantize_dynamic(FP32, p("int8-dyn-pc-ffn-only"), per_channel=True, op_types_to_quantize=["MatMul"], nodes_to_quantize=ffn, **DQ))
build("int8-dyn-pc-attn-only", "dynamic per-channel, attention MatMuls only (FFN fp32)", lambda: quantize_dynamic(FP32, p("int8-dyn-pc-attn-only"), per_channel=True, op_types_to_quantize=["MatMul"], nodes_to_quantize=attn, **DQ))
build("int8-dyn-pc-no-ffn-out", "dynamic per-channel, FFN output MatMuls kept fp32", lambda: quantize_dynamic(FP32, p("int8-dyn-pc-no-ffn-out"), per_channel=True, op_types_to_quantize=["MatMul"], nodes_to_exclude=A + ffn_out, **DQ))
build("fused-int8-dyn-pc", "fused graph, dynamic per-channel MatMul+Attention(QAttention)", lambda: quantize_dynamic(FUSED, p("fused-int8-dyn-pc"), per_channel=True, op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=FA, extra_options={"DefaultTensorType": T.FLOAT}, **DQ))
def smooth(src, name, alpha):
    old = R.SMOOTHING_ALPHA; R.SMOOTHING_ALPHA = alpha
    try: R.quantize_int8_smoothed(src, p(name), CAL)
    finally: R.SMOOTHING_ALPHA = old
build("int8-smoothquant", "KEPT RECIPE: fused, SmoothQuant a=0.75, dynamic per-channel", lambda: R.quantize_int8_smoothed(FUSED, p("int8-smoothquant"), CAL))
build("int8-smoothquant-a0.5", "fused, SmoothQuant a=0.5, dynamic per-channel", lambda: smooth(FUSED, "int8-smoothquant-a0.5", 0.5))
build("int8-smoothquant-a0.9", "fused, SmoothQuant a=0.9, dynamic per-channel", lambda: smooth(FUSED, "int8-smoothquant-a0.9", 0.9))
build("int8-smoothquant-unfused", "unfused, SmoothQuant a=0.75, dynamic per-channel", lambda: smooth(FP32, "int8-smoothquant-unfused", 0.75))
# static QDQ, calibrated on MASSIVE train (one utterance per batch: no padding in the ranges)
class Reader(CalibrationDataReader):
    def __init__(self, texts, pad=None):
        from tokenizers import Tokenizer
        self.t = Tokenizer.from_file(str(TOKP)); self.t.enable_truncation(256)
        if pad: self.t.enable_padding(pad_id=0, pad_token="[PAD]", length=pad)
        self.it = iter(texts)
    def get_next(self):
        q = next(self.it, None)
        if q is None: return None
        e = self.t.encode(q)
        return {"input_ids": np.array([e.ids], np.int64), "attention_mask": np.array([e.attention_mask], np.int64)}
def static(name, method, nodes_excl=None, nodes_incl=None, pad=None, n=200):
    quantize_static(FP32, p(name), Reader(calib[:n], pad), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                    nodes_to_exclude=nodes_excl or [], nodes_to_quantize=nodes_incl, calibrate_method=method)
build("int8-static-qdq-minmax", "static QDQ u8/s8 per-channel, MinMax, 200 train utterances", lambda: static("int8-static-qdq-minmax", CalibrationMethod.MinMax, A))
build("int8-static-qdq-percentile", "static QDQ, Percentile 99.999 (padded to 40)", lambda: static("int8-static-qdq-percentile", CalibrationMethod.Percentile, A, pad=40))
build("int8-static-qdq-entropy", "static QDQ, Entropy (padded to 40)", lambda: static("int8-static-qdq-entropy", CalibrationMethod.Entropy, A, pad=40))
build("int8-static-qdq-attn-only", "static QDQ MinMax, attention MatMuls only", lambda: static("int8-static-qdq-attn-only", CalibrationMethod.MinMax, nodes_incl=attn))
def nbits(name, bits, block, src=FUSED):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=bits, block_size=block, is_symmetric=False, accuracy_level=4, op_types_to_quantize=("MatMul",))
    q.process(); q.model.save_model_to_file(str(p(name)), use_external_data_format=False)
build("int8-nbits-b32", "fused, MatMulNBits 8-bit block 32, accuracy_level 4 (int8 compute)", lambda: nbits("int8-nbits-b32", 8, 32))
build("int8-nbits-b128", "fused, MatMulNBits 8-bit block 128, accuracy_level 4", lambda: nbits("int8-nbits-b128", 8, 128))
build("int4-nbits-b32", "fused, MatMulNBits 4-bit block 32, accuracy_level 4", lambda: nbits("int4-nbits-b32", 4, 32))
def fp16():
    from onnxruntime.transformers.onnx_model import OnnxModel
    m = OnnxModel(onnx.load(str(FUSED))); m.convert_float_to_float16(keep_io_types=True); m.save_model_to_file(str(p("fp16-fused")))
build("fp16-fused", "fused, float16 weights+compute, fp32 io", fp16)
def bf16():
    # bf16 MatMul on the CPU EP: a one-node model is enough to see whether a kernel exists.
    g = h.make_graph([h.make_node("MatMul", ["a", "b"], ["y"])], "g",
                     [h.make_tensor_value_info("a", T.BFLOAT16, [2, 384]), h.make_tensor_value_info("b", T.BFLOAT16, [384, 384])],
                     [h.make_tensor_value_info("y", T.BFLOAT16, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    C.open_session(m.SerializeToString())
build("bf16", "bfloat16 MatMul on ORT CPU EP", bf16)
print(f"build phase {time.perf_counter()-t0:.0f}s", flush=True)
ref = E.reference_embeddings(HF, queries)
rows = {}
for name, path in built.items():
    prec = "fp32" if name in ("fp32", "fp32-fused") else "int8"
    s = C.open_session(path)
    per = {b: C.parity_of(s, tok, queries, ref, prec, (b,)) for b in (1, 32, 64, 128)}
    gated = C.parity_of(s, tok, queries, ref, prec, C.PARITY_BATCH_SIZES)
    rows[name] = {"parity": gated, "per": per}
    print(f"parity {name}: {gated.describe()} passed={gated.passed} | bs128 mean {per[128].mean:.5f} min {per[128].min:.5f}", flush=True)
print(f"parity phase done {time.perf_counter()-t0:.0f}s", flush=True)
sessions = {n: C.open_session(pth) for n, pth in built.items()}
samples = {n: {1: [], 32: []} for n in sessions}
for s in sessions.values():
    for b in (1, 32): C.measure(s, tok, queries, b, 0.2)  # warm up
for r in range(ROUNDS):
    for b in (1, 32):
        for n, s in sessions.items():
            samples[n][b].append(C.measure(s, tok, queries, b, SECS))
    print(f"round {r+1} done {time.perf_counter()-t0:.0f}s", flush=True)
out = []
print(f"\n{'variant':28s} {'gate':4s} {'mean':>9s} {'min':>9s} {'min@128':>8s} {'bs1 q/s':>8s} {'bs32 q/s':>8s}  size MB")
for n in list(built) + list(errors):
    if n in errors:
        print(f"{n:28s} ERROR {errors[n][:150]}"); out.append({"name": n, "recipe": recipe[n], "error": errors[n]}); continue
    g = rows[n]["parity"]; q1 = statistics.median(samples[n][1]); q32 = statistics.median(samples[n][32])
    print(f"{n:28s} {'pass' if g.passed else 'FAIL':4s} {g.mean:9.6f} {g.min:9.6f} {rows[n]['per'][128].min:8.5f} {q1:8.0f} {q32:8.0f}  {built[n].stat().st_size/1e6:.0f}")
    out.append({"name": n, "recipe": recipe[n], "passed": g.passed, "mean": g.mean, "min": g.min, "max_norm_error": g.max_norm_error,
                "per_batch": {b: [x.mean, x.min] for b, x in rows[n]["per"].items()},
                "qps_bs1": q1, "qps_bs32": q32, "samples": samples[n], "mb": built[n].stat().st_size/1e6})
(OUT / "sweep.json").write_text(json.dumps(out, indent=1))
print(f"total {time.perf_counter()-t0:.0f}s")
