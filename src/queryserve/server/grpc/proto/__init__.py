"""KServe v2 / Triton protocol messages, generated from this folder's `.proto` files (README.md)."""
