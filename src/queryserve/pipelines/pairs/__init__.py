"""`pair_scoring`: two product texts in, the probability that they are one product out. Either
a bi-encoder with string features and a head (`scoring.py`: each text embedded alone, so the
batch job can block with the embeddings), or a cross-encoder (`cross.py`, `encoder: cross`:
both texts read together, more accurate, one Transformer run per pair)."""
