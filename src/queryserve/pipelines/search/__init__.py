"""The search ensemble, with the catalog it searches and its vector index."""
