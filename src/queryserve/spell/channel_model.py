"""`queryserve train spell-channel`: learn the noisy-channel corrector from the repository's
data into a servable model folder (`model.yaml` and `channel.json`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from queryserve.backends.noisy_channel.noise import NoiseModel
from queryserve.backends.noisy_channel.tables import ChannelParameters, ChannelTables
from queryserve.spell.data import Catalog, Misspellings

CHANNEL_HEADER = """\
# {name}: the noisy-channel spelling corrector, learned by `queryserve train spell-channel`
# from the repository's data (channel.json). Decoding is Python under the GIL: one instance.
"""
HYBRID_HEADER = """\
# {name}: the hybrid spelling corrector (`queryserve train spell-hybrid`): the noisy channel
# (channel.json) proposes its likeliest queries, the seq2seq in seq2seq/ scores them, and the
# network in reranker.json turns both into the probability that each is meant. The channel's
# Python holds the GIL: one instance.
"""
MODEL_YAML = """\
backend: noisy_channel
pipeline: spelling
max_batch_size: 32
input:
- {name: text, datatype: BYTES, dims: [1]}
output:
- {name: generated_text, datatype: BYTES, dims: [1]}
- {name: score, datatype: FP32, dims: [1]}
dynamic_batching: {max_queue_delay_microseconds: 0, max_queue_size: 256}
instance_group: {count: 1}
model_warmup:
- {name: one query, batch_size: 1, text: taylor swfit}
"""


def learn_tables(catalog: Catalog, misspellings: Misspellings, data: Path,
                 parameters: ChannelParameters | None = None) -> ChannelTables:
    """The channel's tables from a split: the catalog's training queries, the dictionary words
    (the misspelling corpus's lexicon and common English words), the training misspellings'
    typo model, and web text's word frequencies (less the known misspellings)."""
    from queryserve.spell.data import load_web_words, load_words

    parameters = parameters or ChannelParameters()
    return ChannelTables.learn(catalog.train, misspellings.lexicon + load_words(data),
                               NoiseModel.learn(misspellings.train), parameters,
                               web=load_web_words(parameters.web_min_zipf),
                               typos={typed for typed, _ in misspellings.train})


def build_channel_model(out: Path, data: Path, parameters: ChannelParameters | None = None,
                        hybrid: bool = False) -> dict[str, object]:
    """A servable model folder (model.yaml + channel.json) learned from the training splits
    (`learn_tables`)."""
    from queryserve.spell.data import load_catalog, load_misspellings

    catalog, misspellings = load_catalog(data), load_misspellings(data)
    tables = learn_tables(catalog, misspellings, data, parameters)
    out.mkdir(parents=True, exist_ok=True)
    path = tables.save(out)
    header = HYBRID_HEADER if hybrid else CHANNEL_HEADER
    (out / "model.yaml").write_text(header.format(name=out.name) + MODEL_YAML)
    return {"model": str(out), "words": len(tables.unigrams),
            "bigram_contexts": len(tables.bigrams), "queries": len(catalog.train),
            "misspellings": len(misspellings.train), "web_words": len(tables.web),
            "bytes": path.stat().st_size,
            "parameters": asdict(tables.parameters)}
