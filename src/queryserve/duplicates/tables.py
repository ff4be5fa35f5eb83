"""Product tables in and pair tables out, for the batch job: CSV (any of , | # ; or tab as the
separator, found from the header), Parquet or JSONL in; Parquet or CSV out, written atomically.

A product's id is its `id` column, or its row number (from 0) when the table has none. A row
with no text (an empty title, and nothing else to read) is left out: it would be embedded as
the empty text, and two of them scored as duplicates of each other.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from queryserve.duplicates.products import (
    ID_COLUMN,
    READ_COLUMNS,
    TITLE_COLUMNS,
    DuplicatesError,
    column_name,
    product_text,
)

READS = (".csv", ".tsv", ".txt", ".parquet", ".jsonl")
WRITES = (".parquet", ".csv")
SEPARATORS = ",|#;\t"


@dataclass(frozen=True)
class Products:
    path: Path
    ids: list[str]
    texts: list[str]
    without_text: list[str]
    """The ids of the rows left out: they hold no text."""
    columns: frozenset[str] = frozenset()
    """The table's column names, as matched (`column_name`)."""


def _rows(path: Path) -> list[dict[str, object]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]
        except Exception as error:  # pyarrow raises several kinds; the user needs one line
            raise DuplicatesError(f"{path} is not a readable Parquet file ({error})") from None
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(_text(path).splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DuplicatesError(f"{path}:{number}: not JSON ({error.msg})") from None
                if not isinstance(row, dict):
                    raise DuplicatesError(f"{path}:{number}: expected a JSON object per line")
                rows.append(row)
        return rows
    return _csv_rows(path, _text(path))  # not UTF-8: refused, not read with bytes replaced


MAX_FIELD_CHARS = 64 * 1024 * 1024


def _csv_rows(path: Path, text: str) -> list[dict[str, object]]:
    """The rows of a CSV table, its separator found from the header. Strict: read leniently,
    a quote that opens a field and never closes ran on over every later row, and 40 rows
    were read as 6 products with exit 0; a separator inside an unquoted title cut the title
    there and dropped the rest. Either is refused, naming the line the record starts on."""
    separator = max(SEPARATORS, key=text.split("\n", 1)[0].count)
    csv.field_size_limit(MAX_FIELD_CHARS)  # the default, 128 KiB, refused a long description
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=separator, strict=True)
    rows: list[dict[str, object]] = []
    start = 1
    try:
        header = next(reader, [])
        start = reader.line_num + 1
        for fields in reader:
            if any(field.strip() for field in fields[len(header):]):
                raise DuplicatesError(
                    f"{path}:{start}: {len(fields)} fields where the header has "
                    f"{len(header)}; quote a field that holds the separator {separator!r}")
            if fields:  # a blank line is no row
                rows.append(dict(zip(header, fields, strict=False)))
            start = reader.line_num + 1
    except csv.Error as error:
        raise DuplicatesError(
            f"{path}:{start}: not a readable CSV record ({error}): a field that opens a quote "
            "(\") must close it just before a separator or the line's end; quote the whole "
            "field and double the quotes inside it") from None
    return rows


def _text(path: Path) -> str:
    try:
        # With or without the byte-order mark Excel's "CSV UTF-8" begins with: kept, it was
        # part of the first column's name, and an `id` column went unread.
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        line = path.read_bytes()[:error.start].count(b"\n") + 1
        raise DuplicatesError(f"{path}:{line}: not UTF-8 text ({error.reason}); save the table "
                              "as UTF-8") from None


def read_products(path: Path, ignore: Collection[str] = ()) -> Products:
    """A table's products, each as one text; the `ignore` columns (any case) left out of it."""
    if not path.is_file():
        raise DuplicatesError(f"{path} is not a file" if path.exists()
                              else f"{path} does not exist")
    if path.suffix.lower() not in READS:
        raise DuplicatesError(f"{path}: expected a product table ({', '.join(READS)})")
    rows = _rows(path)
    if not rows:
        raise DuplicatesError(f"{path} holds no products")
    columns = frozenset(column_name(k) for k in rows[0])
    rows = [_readable(path, number, row) for number, row in enumerate(rows)]
    if ignore:
        left_out = {column_name(name) for name in ignore}
        rows = [{k: v for k, v in row.items() if column_name(k) not in left_out}
                for row in rows]
    if not {column_name(k) for k in rows[0]} & set(TITLE_COLUMNS):
        if any("\ufffd" in name or not name.isprintable() for name in columns):
            raise DuplicatesError(f"{path} does not read as a text table (its first line is not "
                                  f"UTF-8 text): expected CSV, TSV, JSONL or Parquet")
        listed = ", ".join(sorted(columns)[:12]) + (", ..." if len(columns) > 12 else "")
        raise DuplicatesError(f"{path} has no title column: expected one of "
                              f"{', '.join(TITLE_COLUMNS)}; it has {listed}")
    ids = _ids(path, rows)
    texts = [product_text(row) for row in rows]
    kept = [n for n, text in enumerate(texts) if text.strip()]
    if not kept:
        raise DuplicatesError(f"{path} holds no product with a title or any text (a CSV "
                              "table's separator is found from its header: do its rows use "
                              "the same one?)")
    return Products(path, [ids[n] for n in kept], [texts[n] for n in kept],
                    [ids[n] for n, text in enumerate(texts) if not text.strip()], columns)


def _readable(path: Path, number: int, row: dict[str, object]) -> dict[str, object]:
    """The row with the values the job reads as text: bytes (Parquet strings written without
    their UTF-8 annotation) decoded, objects and lists (JSONL) refused. Read as they came,
    ids were written `b'sku-19'` and titles read as Python's spelling of them."""
    for key, value in row.items():
        if isinstance(value, bytes | dict | list) and column_name(key) in READ_COLUMNS:
            if not isinstance(value, bytes):
                raise DuplicatesError(
                    f"{path}: row {number} (from 0), column {key!r} holds a "
                    f"{'JSON object' if isinstance(value, dict) else 'list'}; expected text "
                    "or a number")
            try:
                row = {**row, key: value.decode("utf-8")}
            except UnicodeDecodeError:
                raise DuplicatesError(f"{path}: row {number} (from 0), column {key!r} holds "
                                      "bytes that are not UTF-8 text") from None
    return row


def _ids(path: Path, rows: Sequence[Mapping[str, object]]) -> list[str]:
    """Each row's id; row numbers (from 0) when no row has one. A table whose ids are partly
    missing is refused: numbered, a row could take another's id."""
    given = [_id(row) for row in rows]
    if not any(given):
        return [str(n) for n in range(len(rows))]
    if "" in given:
        raise DuplicatesError(f"{path}: the row numbered {given.index('')} (from 0) has no id, "
                              "while others have one; give every row an id, or none (rows are "
                              "then numbered from 0)")
    seen: set[str] = set()
    for value in given:
        if value in seen:
            raise DuplicatesError(f"{path}: id {value[:100]!r} is on more than one row; ids "
                                  "must be unique")
        seen.add(value)
    return given


def _id(row: Mapping[str, object]) -> str:
    value = next((v for k, v in row.items() if column_name(k) == ID_COLUMN), None)
    return "" if value is None else str(value).strip()


def write_pairs(path: Path, columns: Mapping[str, Sequence[object]]) -> None:
    """Write atomically: a reader sees the whole table or none (a temporary file, renamed)."""
    temporary = path.with_name(f".{path.name}.tmp")
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # Typed: with no pairs, the types inferred from empty columns were null, and a night
        # without duplicates would not load into the table the others did.
        types = {"left_id": pa.string(), "right_id": pa.string(),
                 "probability": pa.float64(), "duplicate": pa.bool_()}
        pq.write_table(pa.table({k: pa.array(list(v), type=types.get(k))
                                 for k, v in columns.items()}), temporary)
    else:
        with temporary.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(zip(*columns.values(), strict=True))
    os.replace(temporary, path)


def read_pairs(path: Path) -> dict[str, list[object]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()  # type: ignore[no-any-return]
