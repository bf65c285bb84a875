import pytest
from hypothesis import given
from hypothesis import strategies as st

from ssdemu.units import format_size, parse_size


@pytest.mark.parametrize(
    "text,value",
    [("512", 512), ("4k", 4096), ("4K", 4096), ("1m", 1 << 20), ("2G", 2 << 30),
     ("1T", 1 << 40), ("64KiB", 64 << 10), ("3MB", 3 << 20), (" 7 ", 7)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "k", "1.5G", "-4k", "4x", "1P", "4 k b"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_format_parse_round_trip(n):
    assert parse_size(format_size(n)) == n

