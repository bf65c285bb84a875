"""The README is a guide and docs/commands.md the reference: checked on the text as it is."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIRST_SCREEN = 40  # lines
MAX_CELL = 400  # characters in a table cell
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d+ min \d+ s\b|\brequests/s\b|\bIOPS\b")


def _cells(text: str):
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("|") and not line.startswith("|---"):
            for cell in line.strip().strip("|").split(" | "):
                yield n, cell.strip()


def test_the_readme_opens_as_a_guide():
    text = (ROOT / "README.md").read_text()
    first = "\n".join(text.split("\n")[:FIRST_SCREEN])
    assert "make demo" in first and "make test" in first
    assert "AI SSD" in first
    assert not DATED.findall(first), DATED.findall(first)


def test_no_table_cell_is_long():
    long = [(f.name, n, len(c)) for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for n, c in _cells(f.read_text()) if len(c) > MAX_CELL]
    assert long == []


def test_the_counter_sees_a_long_cell():
    assert [len(c) for _, c in _cells("| a | " + "x" * 500 + " |")] == [1, 500]


def test_the_command_reference_has_every_command():
    from ssdemu.cli import build_parser

    ref = (ROOT / "docs" / "commands.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if getattr(a, "choices", None))
    names = []
    for name, p in sub.choices.items():
        inner = next((a for a in p._actions if isinstance(getattr(a, "choices", None), dict)),
                     None)
        if name == "bench" and inner:
            names += [f"ssdemu bench {b}" for b in inner.choices]
        else:
            names.append(f"ssdemu {name}")
    missing = [n for n in names if f"## `{n}" not in ref]
    assert missing == []
