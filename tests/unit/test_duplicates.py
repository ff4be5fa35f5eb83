"""The duplicates model's building blocks: product texts from any table's columns, the pair
features, reading tables, and blocking."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from queryserve.duplicates.batch import block, one_to_one
from queryserve.duplicates.products import (
    DuplicatesError,
    load_split,
    parse_record,
    product_text,
)
from queryserve.duplicates.tables import read_products, write_pairs
from queryserve.pipelines.pairs.features import (
    FEATURES,
    hinted,
    model_codes,
    pair_features,
    pair_hint,
)

ROOT = Path(__file__).resolve().parents[2]


def test_product_text_reads_the_columns_tables_have() -> None:
    assert product_text({"Title": "Nikon D40 kit", "brand": "Nikon", "modelno": "25420",
                         "price": "499"}) == "Nikon D40 kit 25420"  # brand once, no price
    assert product_text({"name": "ipod nano", "description": "8gb silver " * 40}) \
        .startswith("ipod nano 8gb silver")
    assert len(product_text({"name": "x", "description": "y" * 1000})) < 210
    record = parse_record("COL title VAL elite screens r85wh1 COL brand VAL elite screens "
                          "COL price VAL 409.0 ")
    assert record == {"title": "elite screens r85wh1", "brand": "elite screens",
                      "price": "409.0"}


def test_the_committed_splits_load_with_deepmatchers_counts() -> None:
    test = load_split("walmart-amazon", "test", ROOT / "data/product-matching")
    assert len(test) == 2049 and sum(p.label for p in test) == 193


def test_pair_features_see_model_numbers_through_their_spellings() -> None:
    assert model_codes("sony dsc-w120/p camera") == {"dscw120p"}
    same = pair_features("sony dsc-w120/p camera", "Sony DSCW120P pink")
    other = pair_features("sony dsc-w120/p camera", "sony dsc-w130 camera")
    assert len(same) == len(FEATURES)
    assert same[FEATURES.index("code_match")] == 1.0
    assert other[FEATURES.index("code_match")] == 0.0
    assert pair_features("a b c", "c d") == pair_features("c d", "a b c")  # symmetric


def test_specifications_are_not_model_numbers_and_siblings_are_told_apart() -> None:
    # "4gb", "1333mhz" and "ddr3" are specifications every memory module shares.
    assert model_codes("corsair cmv4gx3m1a1333c9 4gb ddr3 1333mhz 82024") == {
        "cmv4gx3m1a1333c9", "82024"}
    siblings = pair_features("pioneer ts-a1684r 4-way speakers", "pioneer TS-A1683R speakers")
    assert siblings[FEATURES.index("code_sibling")] == 1.0
    assert siblings[FEATURES.index("code_match")] == 0.0
    cards = pair_features("v7 4gb sd card class 6", "v7 16 GB sd card class 6")
    assert cards[FEATURES.index("quantity_conflict")] == 1.0
    same_size = pair_features("v7 4gb sd card", "v7 sdhc card 4 gb")
    assert same_size[FEATURES.index("quantity_conflict")] == 0.0
    unknown = pair_features("v7 sd card", "v7 sdhc card")
    assert unknown[FEATURES.index("quantity_conflict")] == 0.5
    assert unknown[FEATURES.index("code_sibling")] == 0.5


def test_hints_say_in_words_what_model_numbers_and_sizes_say() -> None:
    """The cross-encoder's hints: the same rules as the features, in a few words."""
    assert pair_hint("sony dsc-w120/p camera", "Sony DSCW120P pink") == "same model"
    assert pair_hint("pioneer ts-a1684r speakers", "pioneer TS-A1683R") == "sibling model"
    assert pair_hint("sony dsc-w120 camera", "canon sd1100 camera") == "different model"
    assert pair_hint("v7 4gb sd card class 6", "v7 16 GB sd card") == "different size"
    assert pair_hint("apple ipod nano 8gb", "apple ipod touch 8 gb") == "same size"
    assert pair_hint("v7 sd card", "v7 sdhc card") == ""  # nothing to tell
    assert pair_hint("a dsc-w120 4gb", "b dscw120 4gb") == pair_hint("b dscw120 4gb",
                                                                    "a dsc-w120 4gb")
    assert hinted([("sony dsc-w120", "sony dscw120"), ("v7 sd", "v7 sdhc")]) == [
        ("same model | sony dsc-w120", "sony dscw120"), ("v7 sd", "v7 sdhc")]


def test_tables_in_any_format(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id#title#manufacturer\n7#ipod nano#apple\n9#zune#\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"name": "ipod"}) + "\n")
    write_pairs(tmp_path / "c.parquet", {"ID": ["x"], "Product_Name": ["kindle"]})
    assert read_products(tmp_path / "a.csv").ids == ["7", "9"]
    assert read_products(tmp_path / "a.csv").texts == ["ipod nano apple", "zune"]
    assert read_products(tmp_path / "b.jsonl").ids == ["0"]  # row numbers without an id
    assert read_products(tmp_path / "c.parquet").texts == ["kindle"]
    # A column left out of the texts (any case), the ids kept.
    (tmp_path / "f.csv").write_text("id#title#Description\n7#ipod nano#tiny music player\n")
    assert read_products(tmp_path / "f.csv").texts == ["ipod nano tiny music player"]
    assert read_products(tmp_path / "f.csv", ["description"]).texts == ["ipod nano"]
    assert read_products(tmp_path / "f.csv", ["DESCRIPTION "]).ids == ["7"]
    with pytest.raises(DuplicatesError, match="no title column"):
        read_products(tmp_path / "f.csv", ["title"])
    (tmp_path / "d.csv").write_text("id,title\n1,a\n1,b\n")
    with pytest.raises(DuplicatesError, match="id '1' is on more than one row"):
        read_products(tmp_path / "d.csv")
    # A row without an id among rows with one took its row number, which another row could
    # hold ("repeats ids" then, of a file whose ids were unique): refused, naming the row.
    (tmp_path / "g.jsonl").write_text('{"id": "1", "title": "a"}\n{"title": "b"}\n')
    with pytest.raises(DuplicatesError, match=r"row numbered 1 \(from 0\) has no id"):
        read_products(tmp_path / "g.jsonl")
    # A row with no text was embedded as the empty text (two of them: "duplicates"): left out.
    (tmp_path / "h.csv").write_text("id,title,brand\n1,ipod,apple\n2,,\n3, ,\n4,,sony\n")
    products = read_products(tmp_path / "h.csv")
    assert (products.ids, products.texts, products.without_text) == (
        ["1", "4"], ["ipod apple", "sony"], ["2", "3"])
    (tmp_path / "i.csv").write_text("id,title\n1,\n")
    with pytest.raises(DuplicatesError, match="no product with a title or any text"):
        read_products(tmp_path / "i.csv")
    (tmp_path / "e.jsonl").write_text("[1]\n")
    with pytest.raises(DuplicatesError, match=r"e\.jsonl:1: expected a JSON object"):
        read_products(tmp_path / "e.jsonl")
    # A title of 1 MB was a csv.Error traceback (the field limit), Latin-1 bytes a
    # UnicodeDecodeError in JSONL and U+FFFD in place of the letters in CSV.
    (tmp_path / "long.csv").write_text("id,title\n1," + "x" * 1_000_000 + "\n")
    assert len(read_products(tmp_path / "long.csv").ids) == 1
    for name, line in (("latin.jsonl", b'{"title": "caf\xe9"}\n'),
                       ("latin.csv", b"id,title\n1,caf\xe9\n")):
        (tmp_path / name).write_bytes(b"\n" * (name == "latin.jsonl") + line)
        with pytest.raises(DuplicatesError, match=rf"{name}:2: not UTF-8 text"):
            read_products(tmp_path / name)


def test_tables_as_spreadsheets_and_exporters_write_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Excel's "CSV UTF-8" begins with a byte-order mark; the id column spelled another way:
    # the ids had become row numbers, with exit 0 (and a BOM before "title" was "not UTF-8").
    for name, text in (("bom.csv", "\ufeffid,name\nsku-1,ipod\nsku-2,zune\n"),
                       ("bom_title.csv", "\ufefftitle,id\nipod,sku-1\nzune,sku-2\n"),
                       ("Id.csv", "Id|Name\nsku-1|ipod\nsku-2|zune\n"),
                       ("space.csv", "name, id\nipod, sku-1\nzune, sku-2\n"),
                       ("bom.jsonl", '\ufeff{"id": "sku-1", "title": "ipod"}\n'
                                     '{"id": "sku-2", "title": "zune"}\n')):
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert read_products(tmp_path / name).ids == ["sku-1", "sku-2"], name
    # An unclosed quote ran over every later row (40 rows read as 6 products, exit 0), and a
    # separator in an unquoted title cut it there: both refused, naming the record's line.
    (tmp_path / "quote.csv").write_text('id|name\n1|ipod\n2|"zune 4gb\n3|kindle\n4|nook\n')
    with pytest.raises(DuplicatesError, match=r"quote\.csv:3: not a readable CSV record"):
        read_products(tmp_path / "quote.csv")
    (tmp_path / "commas.csv").write_text("id,name,price\n0,ipod nano, 8gb, silver,99\n")
    with pytest.raises(DuplicatesError, match=r"commas\.csv:2: 5 fields where the header has "
                                              r"3; quote a field that holds the separator ','"):
        read_products(tmp_path / "commas.csv")
    # What stays readable: inches in a title, a quoted separator or line break, a row ending
    # in an empty field the header lacks.
    (tmp_path / "fine.csv").write_text('id,name\n1,tv 42" hd\n2,"zune, 4gb\nblack"\n3,nook,\n')
    assert read_products(tmp_path / "fine.csv").texts == ['tv 42" hd', "zune, 4gb black", "nook"]
    # Parquet strings written as bytes (no UTF-8 annotation) are text; objects are refused.
    pq.write_table(pa.table({"id": pa.array([b"sku-1"], pa.binary()),
                             "title": pa.array([b"ipod"], pa.binary())}), tmp_path / "b.parquet")
    products = read_products(tmp_path / "b.parquet")
    assert (products.ids, products.texts) == (["sku-1"], ["ipod"])
    (tmp_path / "object.jsonl").write_text('{"id": "1", "title": {"text": "ipod"}}\n')
    with pytest.raises(DuplicatesError, match="row 0 \\(from 0\\), column 'title' holds a JSON "
                                              "object; expected text or a number"):
        read_products(tmp_path / "object.jsonl")
    # A night with no pairs keeps the columns' types (they were null).
    write_pairs(tmp_path / "none.parquet", {"left_id": [], "right_id": [], "probability": [],
                                            "duplicate": []})
    assert [str(t) for t in pq.read_schema(tmp_path / "none.parquet").types] == [
        "string", "string", "double", "bool"]


def test_blocking_keeps_neighbours_and_shared_model_numbers() -> None:
    rng = np.random.default_rng(0)
    left = rng.normal(size=(5, 8)).astype(np.float32)
    right = np.concatenate([left + 0.01, rng.normal(size=(20, 8))]).astype(np.float32)
    texts = [[f"item {i}" for i in range(5)],
             [f"item {i}" for i in range(25)]]
    texts[1][24] = "widget abc123"
    texts[0][0] = "gadget ABC-123"
    pairs = block([left, right], texts, k=1)
    assert {(i, i) for i in range(5)} <= {tuple(p) for p in pairs.tolist()}
    assert [0, 24] in pairs.tolist()  # the shared model number, however far apart
    assert pairs.tolist() == sorted(pairs.tolist())
    within = block([right], [texts[1]], k=2)
    assert all(i < j for i, j in within.tolist())


def test_one_to_one_keeps_the_pair_both_sides_like_best() -> None:
    pairs = {"left_id": ["a", "a", "b", "c"], "right_id": ["x", "y", "x", "z"],
             "probability": [0.9, 0.8, 0.95, 0.3], "duplicate": [True, True, True, False]}
    # b-x is both sides' likeliest; a-x is not x's, a-y is not a's (a likes x more): a is
    # left without a duplicate rather than given its second choice; c-z never was one.
    assert one_to_one(pairs) == [False, False, True, False]


def test_neighbour_pairs_are_the_likeliest_unlabelled_partners() -> None:
    from queryserve.duplicates.distil import neighbour_pairs
    from queryserve.duplicates.products import LabelledPair

    pairs = [LabelledPair("apple ipod nano 8gb silver", "apple ipod nano 8 gb silver", 1),
             LabelledPair("garmin nuvi 350 gps", "garmin nuvi 350 navigator", 1),
             LabelledPair("garmin nuvi 350 gps", "apple ipod touch 8gb", 0)]
    found = neighbour_pairs(pairs, 1)
    # Each product's nearest partner, less the labelled pairs: the ipod touch is nearest to
    # the nano (their shared words), and nothing pairs with a product sharing no word.
    assert found == [("apple ipod nano 8gb silver", "apple ipod touch 8gb")]
    assert neighbour_pairs(pairs, 1) == found  # deterministic
    assert neighbour_pairs(pairs, 0) == [] and neighbour_pairs([], 3) == []
    wider = neighbour_pairs(pairs, 3)
    assert set(found) <= set(wider)
    assert not {(p.left, p.right) for p in pairs} & set(wider)
