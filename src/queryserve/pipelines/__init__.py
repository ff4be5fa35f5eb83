"""Pipelines: pre-processing -> model -> post-processing, behind one request method each."""
