"""The layers, checked on the import graph (every import statement, also those inside
functions): the wire format imports neither side; the device imports no client code; the
client imports no device code.  Tools (CLI, replay, bench, torture) may use both."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = ("ssdemu_wire", "ssdemu", "hostlib", "firmware", "bench", "traces")
# the device: the daemon and what it runs; tools are the rest of ssdemu
DEVICE = {f"ssdemu.{m}" for m in ("daemon", "admin", "store", "media", "profile", "timing",
                                  "engine", "units", "errors", "latency", "faults",
                                  "metrics", "buffers", "__init__")} | {"firmware"}


def module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    graph = {}
    for pkg in OURS:
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name.startswith("build_"):
                continue  # build scripts run at install time, not imported
            names = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module)
                    names |= {f"{node.module}.{a.name}" for a in node.names}
            graph[module_of(path)] = {n for n in names if n.split(".")[0] in OURS}
    return graph


def closure(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for dep in graph.get(m, ()):
            # "from a import b" names a module a.b or a name in a: follow what exists
            target = dep if dep in graph else dep.rsplit(".", 1)[0]
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def in_device(name: str) -> bool:
    return name in DEVICE or name.split(".")[0] == "firmware"


def test_layers_hold_on_the_import_graph():
    graph = imports()
    assert "ssdemu.daemon" in graph and "hostlib.client" in graph
    for m in graph:
        deps = closure(graph, m)
        if m.startswith("ssdemu_wire"):
            assert all(d.startswith("ssdemu_wire") for d in deps), (m, deps)
        if m.startswith("hostlib"):
            bad = {d for d in deps if not d.startswith(("hostlib", "ssdemu_wire"))}
            assert not bad, f"the client {m} imports {bad}"
        if in_device(m):
            bad = {d for d in deps if d.startswith("hostlib") or
                   (d.startswith("ssdemu.") and not in_device(d))}
            assert not bad, f"the device module {m} imports {bad}"


def test_the_check_sees_a_violation():
    """The closure follows imports inside functions: a fake client module importing the
    firmware is caught."""
    graph = imports()
    graph["hostlib.fake"] = {"firmware.quant"}
    graph["hostlib.client"] = graph["hostlib.client"] | {"hostlib.fake"}
    deps = closure(graph, "hostlib.client")
    assert "firmware.quant" in deps
