"""The identifier → location encoding (issue 7): reversible, collision-free, always inside its root."""

from __future__ import annotations

import os
import pickle
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ticdc_delta.errors import IdentifierError, SinkError, TerminalError
from ticdc_delta.locations import (
    MAX_COMPONENT_BYTES,
    check_inside,
    child_location,
    decode_component,
    encode_component,
    file_path,
    fold_name,
    local_path,
    overlaps,
    table_location,
    table_name_problem,
    tidb_lower,
)

# any text a TiDB name could hold: every code point except NUL and unpaired surrogates
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)
SAFE = set(string.ascii_letters + string.digits + "_-.@")


@settings(max_examples=400, deadline=None)
@given(names)
def test_round_trip_and_safe_alphabet(name: str) -> None:
    component = encode_component(name)
    assert decode_component(component) == name
    assert set(component) <= SAFE
    assert component not in (".", "..") and not component.startswith((".", "_"))
    assert component.isascii() and len(component.encode()) <= MAX_COMPONENT_BYTES


@settings(max_examples=400, deadline=None)
@given(names, names)
def test_distinct_names_never_share_a_component(a: str, b: str) -> None:
    if a != b:
        assert encode_component(a) != encode_component(b)


@settings(max_examples=300, deadline=None)
@given(names, names)
def test_every_table_location_is_inside_its_root(schema: str, table: str) -> None:
    for root in ("/data/lake", "s3://bucket/lake/", "file:///tmp/x", "relative/lake"):
        location = table_location(root, schema, table)
        assert check_inside(root, location) == location
        assert location.startswith(root.rstrip("/") + "/")
        assert location.count("/") == root.rstrip("/").count("/") + 2


def test_ordinary_names_keep_todays_directories() -> None:
    # lakes written before the encoding existed keep working for names of letters, digits and _
    for name in ("orders", "Orders2", "order_items", "t1", "a_b_c", "x-y", "v1.2"):
        assert encode_component(name) == name
    assert table_location("/lake", "shop", "orders") == "/lake/shop/orders"
    # and the separators keep the escapes they had: a/b -> a@002fb, . -> @002e
    assert encode_component("a/b") == "a@002fb" and encode_component(".") == "@002e"


@pytest.mark.parametrize(
    "name, component",
    [("..", "@002e."), ("a\\b", "a@005cb"), ("100%", "100@0025"), ("@002f", "@0040002f"), ("_tmp", "@005ftmp"),
     (".hidden", "@002ehidden"), ("a b", "a@0020b"), ("c:d", "c@003ad"), ("表", "@8868"), ("😀", "@u01f600"),
     ("\n", "@000a"), ("../../escape", "@002e.@002f..@002fescape")],
)
def test_escapes(name: str, component: str) -> None:
    assert encode_component(name) == component
    assert decode_component(component) == name


@pytest.mark.parametrize(
    "component", ["a/b", "..", ".", "", "@002F", "@zzzz", "@00", "a@0061", "_x", ".x", "a b", "@u110000", "%2f", "@0000"]
)
def test_decode_refuses_what_encode_never_makes(component: str) -> None:
    with pytest.raises(ValueError, match="not an encoded schema or table name"):
        decode_component(component)


@pytest.mark.parametrize(
    "name, match",
    [("", "is empty"), ("a\x00b", "holds NUL"), ("a\ud800", "unpaired surrogate"),
     ("x" * 256, "needs 256 bytes as a path component; at most 255 fit"),
     ("表" * 52, "needs 260 bytes")],
)
def test_names_no_location_can_hold(name: str, match: str) -> None:
    with pytest.raises(IdentifierError, match=match):
        encode_component(name)
    with pytest.raises(IdentifierError, match=r"table 's'\.") as info:
        table_location("/lake", "s", name)
    assert isinstance(info.value, SinkError) and isinstance(info.value, TerminalError)
    assert not info.value.retryable
    assert "table 's'." in (table_name_problem("s", name) or "")
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is IdentifierError and str(again) == str(info.value)


def test_long_names_are_cut_short_in_messages() -> None:
    problem = table_name_problem("s", "y" * 10_000)
    assert problem is not None and len(problem) < 400


def test_the_longest_name_that_fits() -> None:
    assert encode_component("x" * 255) == "x" * 255
    assert table_name_problem("s", "x" * 255) is None
    # 51 escaped BMP characters take 255 bytes
    assert len(encode_component("表" * 51)) == 255


@pytest.mark.parametrize(
    "root, location",
    [("/lake", "/lake"), ("/lake", "/lake/../x"), ("/lake", "/lake/s/../../x"), ("/lake", "/lakes/x"),
     ("/lake", "/other/lake/s/t"), ("s3://b/lake", "s3://c/lake/s/t"), ("s3://b/lake", "gs://b/lake/s/t"),
     ("/lake", "lake/s/t"), ("/lake", "/")],
)
def test_check_inside_refuses_locations_outside(root: str, location: str) -> None:
    with pytest.raises(IdentifierError, match="is not inside its root"):
        check_inside(root, location)


def test_roots_may_hold_dotdot() -> None:
    assert table_location("../lake", "s", "t") == "../lake/s/t"
    assert table_location("/data/../lake/", "s", "..") == "/data/../lake/s/@002e."
    with pytest.raises(IdentifierError, match="is not inside its root"):
        check_inside("../lake", "../lake/s/../../x")


def test_child_locations() -> None:
    assert child_location("/ckpt/", "state") == "/ckpt/state"
    assert child_location("s3://b/lake", "_ticdc_dead_letter") == "s3://b/lake/_ticdc_dead_letter"
    for bad in ("..", "", "a/b", "."):
        with pytest.raises(IdentifierError):
            child_location("/ckpt", bad)


def test_fold_name() -> None:
    assert fold_name("SHOP") == "shop" and fold_name("Orders") == "orders"
    assert fold_name("Orders", case_sensitive=True) == "Orders"


# name → TiDB's lower case, as Go 1.26's strings.ToLower (model.NewCIStr(name).L) gives it
TIDB_LOWER = [
    ("ΟΔΟΣ", "οδοσ"),  # no Final_Sigma: Python's lower() gives "οδος", TiDB's other table
    ("ΣΑΣ Σ", "σασ σ"), ("ΑΣ1", "ασ1"), ("οδος", "οδος"),
    ("İstanbul", "istanbul"),  # the simple mapping: Python's lower() gives "i" + U+0307, two code points
    ("STRAẞE", "straße"), ("Straße", "straße"),  # no folding: casefold() gives "strasse"
    ("ǅemal", "ǆemal"), ("ÀÉÎ_Ω", "àéî_ω"), ("Shop_1.$x", "shop_1.$x"),
]


@pytest.mark.parametrize("name,lower", TIDB_LOWER)
def test_tidb_lower_is_gos(name: str, lower: str) -> None:
    """TiDB compares names by Go's lower case (columns of a configured key are matched by it)."""
    assert tidb_lower(name) == lower


@pytest.mark.parametrize("name", ["ΟΔΟΣ", "İstanbul", "Orders", "ΣΑΣ Σ"])
def test_table_names_fold_as_earlier_versions_folded_them(name: str) -> None:
    """Table and schema names keep Python's lower case, which the Delta locations and job states of earlier
    versions are keyed by: folded as TiDB folds them, a table named with a word-final capital Σ or İ got a
    new location and state key on upgrade, and its next rows started a second table (found by a review of
    upgrades)."""
    assert fold_name(name) == name.lower()
    assert fold_name(name, case_sensitive=True) == name


def test_every_code_point_lowers_to_one() -> None:
    """Go lowers one code point to one; Python's lower() does too except where its full mapping adds
    code points (a newer Unicode could bring more: they need Go's simple mapping, as U+0130 has)."""
    cased = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and chr(c).lower() != chr(c)]
    assert [c for c in cased if len(tidb_lower(c)) != 1] == []
    assert tidb_lower("".join(cased)) == "".join(tidb_lower(c) for c in cased)  # no context rules


@given(st.text(st.characters(max_codepoint=0x7F), max_size=40))
def test_ascii_names_fold_as_before(name: str) -> None:
    """Delta tables of ASCII names stay where they are."""
    assert fold_name(name) == name.lower()


def test_overlaps() -> None:
    assert overlaps("/lake/s/t", "/lake/s/t") and overlaps("/lake/s/t", "/lake/s") and overlaps("/lake", "/lake/s/t")
    assert not overlaps("/lake/s/t", "/lake/s/t2") and not overlaps("/lake/s/t", "/lake/x")
    assert not overlaps("s3://a/lake/s", "s3://b/lake/s") and not overlaps("s3://a/lake", "/lake")
    assert overlaps("lake/s/t", os.path.abspath("lake/s"))


@pytest.mark.parametrize(("location", "path"), [
    ("/lake/s", "/lake/s"),
    ("lake/s", "lake/s"),
    ("file:/lake/s", "/lake/s"),  # Hadoop's form
    ("file:///lake/s", "/lake/s"),
    ("file://localhost/lake/s", "/lake/s"),
    ("FILE:///my%20lake", "/my lake"),
    ("s3://bucket/lake", None),
    ("s3a://bucket/lake", None),
    ("abfss://c@acct.dfs.core.windows.net/lake", None),
])
def test_local_path(location: str, path: str | None) -> None:
    assert local_path(location) == path


@pytest.mark.parametrize(("location", "match"), [
    ("file://nas-1/lake", "not of host 'nas-1'"),
    ("file:lake", "needs an absolute path"),
    ("file://", "needs an absolute path"),
])
def test_file_urls_that_name_no_local_file(location: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        file_path(location)
    with pytest.raises(ValueError, match=match):
        local_path(location)
    assert file_path("s3://b/x") == "s3://b/x" and file_path("/x") == "/x"


def test_names_too_long_for_any_location_are_refused_without_filling_the_cache() -> None:
    from ticdc_delta import locations

    before = locations._cached_table_name_problem.cache_info().currsize
    for i in range(20):
        problem = locations.table_name_problem("s", f"{i}" + "x" * 70_000)
        assert problem is not None and "bytes as a path component" in problem
    assert locations._cached_table_name_problem.cache_info().currsize == before
    assert locations.table_name_problem("s", "t") is None
    assert locations._cached_table_name_problem.cache_info().currsize == before + 1 or \
        locations._cached_table_name_problem.cache_info().hits > 0
