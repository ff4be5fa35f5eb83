"""The search bar's catalog: songs (Billboard Hot 100) and products (the product-matching
tables), each with a stable id, a title and a performer or brand.

What is embedded is what a user would type to find the item: "title performer" for a song,
"brand title" for a product (without the brand twice when the title starts with it).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CATALOGS = ("songs", "products")
# (dataset, table file, separator, title column, brand column or "")
PRODUCT_TABLES = (
    ("abt-buy", "abt.csv", "|", "name", ""),
    ("abt-buy", "buy.csv", "|", "name", ""),
    ("amazon-google", "amazon.csv", "#", "title", "manufacturer"),
    ("amazon-google", "gp.csv", "#", "title", "manufacturer"),
    ("walmart-amazon", "walmart.csv", "|", "title", "brand"),
    ("walmart-amazon", "amazon.csv", "|", "title", "brand"),
)


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    catalog: str  # songs or products
    title: str
    performer_or_brand: str

    @property
    def text(self) -> str:
        """What is embedded: the words a search for this item would use."""
        if self.catalog == "songs":
            return f"{self.title} {self.performer_or_brand}".strip()
        if self.title.lower().startswith(self.performer_or_brand.lower()):
            return self.title
        return f"{self.performer_or_brand} {self.title}".strip()

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title,
                "performer_or_brand": self.performer_or_brand}


def songs(data: Path) -> Iterator[Item]:
    with (data / "billboard-hot100" / "hot100_songs_1997_2026.csv").open(newline="") as f:
        for n, row in enumerate(csv.DictReader(f)):
            yield Item(f"song-{n}", "songs", row["title"].strip(), row["performer"].strip())


def products(data: Path) -> Iterator[Item]:
    for dataset, table, separator, title, brand in PRODUCT_TABLES:
        path = data / "product-matching" / dataset / "tables" / table
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter=separator):
                name = " ".join(row[title].split())
                if name:
                    yield Item(f"{dataset}/{table.removesuffix('.csv')}-{row['id']}",
                               "products", name, " ".join((row.get(brand) or "").split()))


def load_items(data: Path, catalog: str) -> list[Item]:
    return list(songs(data) if catalog == "songs" else products(data))
