"""Queueing, batching and running batches on model instances."""
