"""The C tree stays readable: one job per file, short functions (the layout docs/architecture.md
describes).  Counted on the sources as they are: a C file over 900 lines, or a function whose
body runs over 80 lines, fails with its name."""

import pathlib
import re

import pytest

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


# -- the Python tree: the same rule for functions, and the two classes that hold each side
# of the queue kept small (their jobs are parts they compose, or families they mix in) --

ROOT = C.parent
PY_PACKAGES = ("ssdemu_wire", "ssdemu", "hostlib", "firmware", "traces", "clients/python")
MAX_CLASS_LINES = {("ssdemu/device/daemon.py", "Daemon"): 400,
                   ("hostlib/client.py", "Device"): 400}


def python_definitions():
    """(path, name, kind, lines) of every function and class in the project's packages."""
    import ast

    out = []
    for pkg in PY_PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.is_symlink() or any(p.startswith(".") for p in path.parts):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    out.append((str(path.relative_to(ROOT)), node.name, kind,
                                node.end_lineno - node.lineno + 1))
    return out


def test_no_python_function_is_too_long():
    found = [d for d in python_definitions() if d[2] == "function"]
    assert len(found) > 1000  # the walk sees the tree's functions
    long = {f"{path}:{name}": n for path, name, _, n in found if n > MAX_FUNCTION_LINES}
    assert long == {}


def test_the_daemon_and_the_device_classes_stay_small():
    sizes = {(path, name): n for path, name, kind, n in python_definitions() if kind == "class"}
    for where, limit in MAX_CLASS_LINES.items():
        assert where in sizes, where
        assert sizes[where] <= limit, (where, sizes[where])


# -- layers inside a folder: a file calls only files below it (no circle of files) --------

LAYERED = ("dev", "model", "store")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def call_graph(folder: pathlib.Path) -> dict[str, set[str]]:
    """file -> the files of the folder whose (non-static) functions it calls by name."""
    texts = {p.name: COMMENT.sub("", p.read_text()) for p in sorted(folder.glob("*.c"))}
    owner = {}
    for name, text in texts.items():
        for line in text.split("\n"):
            m = DEF.match(line)
            if m and not line.startswith("static") and not line.rstrip().endswith(";"):
                owner[m.group(1)] = name
    graph = {name: set() for name in texts}
    for name, text in texts.items():
        for fn in set(re.findall(r"\b(\w+)\s*\(", text)):
            if owner.get(fn, name) != name:
                graph[name].add(owner[fn])
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("folder", LAYERED)
def test_the_files_of_a_c_folder_are_layers_not_a_circle(folder):
    graph = call_graph(C / folder)
    assert sum(len(v) for v in graph.values()) > 10  # the parser sees the calls
    assert circles(graph) == []


def test_the_circle_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_data_plane_branches_on_a_context_kind_in_its_table_alone():
    """c/dev/dev_kinds.c's rows say what carries each kind of command on; no other file
    tests a context's kind."""
    branch = re.compile(r"->kind\s*[=!]=|\bcase\s+CTX_|switch\s*\(\s*\w+->kind")
    found = {p.name: branch.findall(COMMENT.sub("", p.read_text()))
             for p in sorted((C / "dev").glob("dev_*.c")) if p.name != "dev_kinds.c"}
    assert {k: v for k, v in found.items() if v} == {}
    assert "CTX_NKINDS" in (C / "dev" / "dev_kinds.c").read_text()
