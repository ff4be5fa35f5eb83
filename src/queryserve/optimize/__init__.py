"""Offline model preparation: ONNX export, reduced-precision variants, accuracy gates.

Nothing here is imported by the serving path; torch and transformers are imported lazily, only
by the functions that export or compute reference embeddings.
"""
