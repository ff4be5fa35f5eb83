"""Products as the duplicates model reads them: one text per product, from any table's row or a
DeepMatcher record.

The model scores two texts, so everything the user sends (`/v1/duplicates`), every row of a
table (`queryserve batch duplicates`) and every labelled record it learned from
(`deepmatcher_split/`) is made into text the same way: the title, then the brand and model
number where the title does not already hold them, then the start of the description. Price is
left out: a text encoder reads numbers poorly, and two listings of one product differ in price.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from queryserve.errors import QueryServeError

DATA = Path("data/product-matching")
DATASETS = ("abt-buy", "amazon-google", "walmart-amazon")
SPLITS = ("train", "valid", "test")
DESCRIPTION_CHARS = 200  # the encoder reads 64 tokens; a long description would crowd the title

# Column names that mean the same thing across the tables users bring.
TITLE_COLUMNS = ("title", "name", "product_name", "product")
BRAND_COLUMNS = ("brand", "manufacturer", "maker")
MODEL_COLUMNS = ("modelno", "model", "model_number", "mpn", "sku")
DESCRIPTION_COLUMNS = ("description", "desc")
ID_COLUMN = "id"  # a product's id: in any case, with spaces around it, as the others
READ_COLUMNS = frozenset((ID_COLUMN, *TITLE_COLUMNS, *BRAND_COLUMNS, *MODEL_COLUMNS,
                          *DESCRIPTION_COLUMNS))


class DuplicatesError(QueryServeError):
    pass


def _first(row: Mapping[str, object], names: tuple[str, ...]) -> str:
    for name in names:
        value = row.get(name)
        if value is not None and str(value).strip() and str(value) != "nan":
            return " ".join(str(value).split())
    return ""


def column_name(name: object) -> str:
    """A table's column name as matched: any case, no surrounding spaces."""
    return str(name).lower().strip()


def product_text(row: Mapping[str, object]) -> str:
    """The text of one product: title, brand and model number (unless the title holds them),
    and the description's first characters. Keys are matched case-insensitively."""
    row = {column_name(k): v for k, v in row.items()}
    title = _first(row, TITLE_COLUMNS)
    parts = [title]
    lowered = title.lower()
    for names in (BRAND_COLUMNS, MODEL_COLUMNS):
        value = _first(row, names)
        if value and value.lower() not in lowered:
            parts.append(value)
    description = _first(row, DESCRIPTION_COLUMNS)
    if description and description.lower() != lowered:
        parts.append(description[:DESCRIPTION_CHARS])
    return " ".join(p for p in parts if p)


def parse_record(serialized: str) -> dict[str, str]:
    """A DeepMatcher record, `COL name VAL value COL ...`, as a row."""
    row = {}
    for part in serialized.split("COL ")[1:]:
        name, _, value = part.partition(" VAL ")
        row[name.strip()] = value.strip()
    return row


@dataclass(frozen=True, slots=True)
class LabelledPair:
    left: str
    right: str
    label: int  # 1: the same product


_LINE = re.compile(r"^(.*)\t(.*)\t([01])\s*$")


def load_split(dataset: str, split: str, data: Path = DATA) -> list[LabelledPair]:
    path = data / dataset / "deepmatcher_split" / f"{split}.txt"
    if not path.is_file():
        raise DuplicatesError(f"{path} is missing: the duplicates recipe reads the DeepMatcher "
                              "splits (train.txt, valid.txt, test.txt) under --data")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = _LINE.match(line)
        if match is None:
            raise DuplicatesError(f"{path}:{number}: expected left<TAB>right<TAB>0|1")
        left, right, label = match.groups()
        pairs.append(LabelledPair(product_text(parse_record(left)),
                                  product_text(parse_record(right)), int(label)))
    return pairs
