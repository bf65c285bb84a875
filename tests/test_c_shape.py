"""The C tree stays readable: one job per file, short functions (the layout docs/architecture.md
describes).  Counted on the sources as they are: a C file over 900 lines, or a function whose
body runs over 80 lines, fails with its name."""

import pathlib
import re

C = pathlib.Path(__file__).resolve().parent.parent / "c"
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 80
# a definition's first line at column 0: a return type, a name, an opening parenthesis
DEF = re.compile(r"^(?!static_assert|_Static_assert|typedef|struct \w+ \{|enum)"
                 r"[A-Za-z_][\w \*]*?\b(\w+)\s*\(")


def functions(text: str):
    """(name, lines from its signature to its closing brace) of every function defined."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        m = DEF.match(lines[i])
        if m and not lines[i].rstrip().endswith(";"):
            j = i
            while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and "{" in lines[j]:
                depth, k = 0, j
                while k < len(lines):
                    depth += lines[k].count("{") - lines[k].count("}")
                    if depth == 0:
                        break
                    k += 1
                out.append((m.group(1), k - i + 1))
                i = k
        i += 1
    return out


def sources():
    return sorted(C.rglob("*.[ch]"))


def test_no_c_file_is_too_long():
    assert sources()
    long = {str(p.relative_to(C)): n for p in sources()
            if (n := len(p.read_text().split("\n"))) > MAX_FILE_LINES}
    assert long == {}


def test_no_c_function_is_too_long():
    found = [f for p in sources() for f in functions(p.read_text())]
    assert len(found) > 300  # the parser sees the tree's functions
    long = {name: n for name, n in found if n > MAX_FUNCTION_LINES}
    assert long == {}


def test_the_counter_sees_a_long_function():
    body = "int f(int x)\n{\n" + "    x++;\n" * 90 + "    return x;\n}\n"
    assert functions(body) == [("f", 94)]
