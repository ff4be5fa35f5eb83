"""The spelling corrector's text: catalog queries, a lexicon, and real misspellings, split once.

Everything comes from the repository's `data/` folder (each with its SOURCE.md):

- catalog queries: Billboard Hot 100 titles and performers (as searched alone and together),
  product titles cut to the first few words as people type them, and MASSIVE utterances;
- a lexicon: the correctly spelled words of the misspelling corpus (a dictionary knows them);
- common English words (`english-words`, a WordPiece vocabulary's whole words), which the
  dictionary correctors (the noisy channel, SymSpell) know too;
- real misspellings: `spelling-errors/spell_errors.json` (word -> observed misspellings).

Splits are fixed by a hash of the text, so every command sees the same ones without a file of
ids: 5% of catalog items are held out (their queries are never trained on: the odd names among
them test that unseen words are left alone), MASSIVE keeps its own train/test split, and 20%
of the misspelled words are held out with all their misspellings (the noise model never sees
them). Text is lower-cased: search queries are matched without case.
"""

from __future__ import annotations

import csv
import json
import math
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from queryserve.errors import QueryServeError

_SOURCE_DATA = Path(__file__).resolve().parents[3] / "data"
DATA = _SOURCE_DATA if _SOURCE_DATA.is_dir() else Path("data")
"""The repository's data folder, found from this file (an editable install, as `make setup`
makes) so the commands work from any directory; else `data` in the working directory."""
NEEDED = ("billboard-hot100/hot100_songs_1997_2026.csv", "catalog-titles/titles.txt",
          "english-words/words.txt", "massive-en/train.jsonl", "massive-en/test.jsonl",
          "spelling-errors/spell_errors.json")


class SpellDataError(QueryServeError):
    """The data folder lacks a file the spelling recipes read."""


def check_data(data: Path) -> Path:
    """`data` if it holds every file the spelling recipes read, else a one-line error."""
    missing = [name for name in NEEDED if not (data / name).is_file()]
    if missing:
        raise SpellDataError(f"{data} is not the repository's data folder: it lacks "
                             f"{', '.join(missing)}")
    return data
HELD_OUT_ITEMS = 0.05
HELD_OUT_WORDS = 0.20
DEVELOPMENT_WORDS = HELD_OUT_WORDS + 0.10
"""The misspelled words in the next 10% of hashes after the held-out ones: the development
split's words (`development_misspellings`)."""
MAX_QUERY_CHARS = 64
_SPACES = re.compile(r"\s+")
_FEATURING = re.compile(r"\s+(?:featuring|feat\.|ft\.|with|x|&|and|,)\s+", re.IGNORECASE)


def held_out(text: str, fraction: float) -> bool:
    """A stable split: the same text lands on the same side in every process."""
    return zlib.crc32(text.encode()) % 10_000 < fraction * 10_000


def clean(text: str) -> str:
    return _SPACES.sub(" ", text.replace('"', " ")).strip().lower()


@dataclass(frozen=True)
class Catalog:
    """Queries as a search bar sees them, split into train and held-out."""
    train: list[str]
    held_out: list[str]


@dataclass(frozen=True)
class Misspellings:
    """(misspelling, word) pairs, split by word."""
    train: list[tuple[str, str]]
    held_out: list[tuple[str, str]]
    lexicon: list[str]  # every correct word, both splits: the dictionary knows them all


def _song_queries(data: Path) -> Iterable[tuple[str, list[str]]]:
    with (data / "billboard-hot100" / "hot100_songs_1997_2026.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            title, performer = clean(row["title"]), clean(row["performer"])
            lead = _FEATURING.split(performer)[0]
            yield title + "|" + performer, [title, lead, f"{title} {lead}"]


def _product_queries(data: Path) -> Iterable[tuple[str, list[str]]]:
    for line in (data / "catalog-titles" / "titles.txt").read_text().splitlines():
        words = clean(line).replace(" - ", " ").split()
        # A shopper types the head of a title: brand and product, not the whole listing.
        yield line, [" ".join(words[:n]) for n in (3, 5) if len(words) >= n] or [" ".join(words)]


def _massive(data: Path, split: str) -> list[str]:
    lines = (data / "massive-en" / f"{split}.jsonl").read_text().splitlines()
    return [clean(json.loads(line)["text"]) for line in lines]


def load_catalog(data: Path = DATA) -> Catalog:
    train: dict[str, None] = {}  # ordered sets: stable across runs, no duplicates
    test: dict[str, None] = {}
    for key, queries in [*_song_queries(data), *_product_queries(data)]:
        side = test if held_out(key, HELD_OUT_ITEMS) else train
        side.update((q, None) for q in queries if 0 < len(q) <= MAX_QUERY_CHARS)
    train.update((q, None) for q in _massive(data, "train") if len(q) <= MAX_QUERY_CHARS)
    test.update((q, None) for q in _massive(data, "test") if len(q) <= MAX_QUERY_CHARS)
    return Catalog([q for q in train if q not in test], list(test))


def development_catalog(data: Path = DATA) -> Catalog:
    """The training side of `load_catalog` split again, the same way, for choosing parameters
    without looking at the held-out queries: the items in the next 5% of hashes and 10% of
    MASSIVE's training utterances become `held_out`; the held-out items are left out."""
    train: dict[str, None] = {}
    development: dict[str, None] = {}
    for key, queries in [*_song_queries(data), *_product_queries(data)]:
        if not held_out(key, HELD_OUT_ITEMS):
            side = development if held_out(key, 2 * HELD_OUT_ITEMS) else train
            side.update((q, None) for q in queries if 0 < len(q) <= MAX_QUERY_CHARS)
    for q in _massive(data, "train"):
        if len(q) <= MAX_QUERY_CHARS:
            (development if held_out(q, 0.10) else train)[q] = None
    test = set(load_catalog(data).held_out)
    development = {q: None for q in development if q not in test}
    return Catalog([q for q in train if q not in development and q not in test],
                   list(development))


def development_misspellings(data: Path = DATA) -> Misspellings:
    """The training side of `load_misspellings` split again by word, for choosing parameters
    and fitting what sits on top of a trained model: the words in `DEVELOPMENT_WORDS` become
    `held_out` (their misspellings are never trained on); the held-out words are left out."""
    misspellings = load_misspellings(data)
    train: list[tuple[str, str]] = []
    development: list[tuple[str, str]] = []
    for typed, word in misspellings.train:
        (development if held_out(word, DEVELOPMENT_WORDS) else train).append((typed, word))
    return Misspellings(train, development, misspellings.lexicon)


def clean_texts(catalog: Catalog, misspellings: Misspellings) -> list[str]:
    """What the corrector and its baseline know as correctly spelled: the training catalog's
    queries and the lexicon (the model trains on them, SymSpell's dictionary is their words)."""
    return catalog.train + misspellings.lexicon


def load_words(data: Path = DATA) -> list[str]:
    """Common English words: the dictionary correctors' knowledge beyond the catalog."""
    return (data / "english-words" / "words.txt").read_text().split()


def load_web_words(min_zipf: float) -> dict[str, float]:
    """English words of web text and their Zipf frequency (log10 of uses per billion words),
    from the `wordfreq` package's "large" list (Wikipedia, subtitles, news, books, web
    crawls, Reddit and Twitter; data CC BY-SA 4.0): the noisy channel's evidence that an
    unseen word ("errands", "schism", "costco") is a word, not a typo."""
    from wordfreq import get_frequency_dict

    frequencies = get_frequency_dict("en", wordlist="large")  # uses per word of text
    return {word: zipf for word, frequency in frequencies.items()
            if (zipf := math.log10(frequency * 1e9)) >= min_zipf}


RARE_MIN_ZIPF = 2.0
"""`rare_words` are used at least 100 times per billion words of web text: 72 k of them for
the training split; below that the list holds typos of its own ("hpw", "takee")."""


def rare_words(queries: Iterable[str], lexicon: Iterable[str],
               typos: Iterable[str]) -> list[str]:
    """Words of web text (`load_web_words`) that no query and no dictionary word holds, nor a
    known misspelling: the unseen names and rare words `train spell --copy-share` puts into
    training queries for the seq2seq to copy."""
    known = {word for text in [*queries, *lexicon] for word in text.split()} | set(typos)
    return sorted(word for word in load_web_words(RARE_MIN_ZIPF)
                  if len(word) >= 3 and word.isascii() and word.isalpha()
                  and word not in known)


def dictionary_texts(catalog: Catalog, misspellings: Misspellings, words: list[str]) -> list[str]:
    """Everything SymSpell's dictionary holds: the clean texts and common English words."""
    return clean_texts(catalog, misspellings) + words


def load_misspellings(data: Path = DATA) -> Misspellings:
    corpus: dict[str, list[str]] = json.loads(
        (data / "spelling-errors" / "spell_errors.json").read_text())
    train: list[tuple[str, str]] = []
    test: list[tuple[str, str]] = []
    for word, observed in corpus.items():
        side = test if held_out(word, HELD_OUT_WORDS) else train
        # Case variants ("Chemistry" for "chemistry") are not misspellings once lower-cased.
        side.extend((m.lower(), word) for m in observed if m.lower() != word and " " not in m)
    return Misspellings(train, test, sorted(corpus))
