"""Front ends: HTTP (KServe v2 / Triton, OpenAI embeddings, metrics) over one engine."""
