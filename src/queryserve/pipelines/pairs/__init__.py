"""`pair_scoring`: a bi-encoder, its string features and its head, serving pairs of product
texts."""
