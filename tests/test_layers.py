"""The layers, checked on the import graph (every import statement, also those inside
functions, and the compiled modules they load): each package is in one layer by its name's
prefix, and a layer imports only the layers below it (docs/architecture.md draws them)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = ("ssdemu_wire", "ssdemu", "hostlib", "firmware", "traces")

# Layer by package prefix (the longest prefix that matches names a module's layer), and what
# each layer may import besides itself.  Bottom up: the wire format; shared errors and units;
# the in-drive kernels; the timing model; the device; the client; traces; the tools that are
# clients of the device; replay; benchmarks; the command line on top.
LAYER_OF = {
    "ssdemu_wire": "wire",
    "ssdemu": "base",  # ssdemu/__init__, errors, units
    "firmware": "firmware",
    "ssdemu.sim": "sim",
    "ssdemu.device": "device",
    "hostlib": "client",
    "traces": "traces",
    "ssdemu.llm": "llm",
    "ssdemu.tools": "tools",
    "ssdemu.replay": "replay",
    "ssdemu.bench": "bench",
    "ssdemu.cli": "cli",
    "ssdemu.__main__": "cli",
}
MAY_IMPORT = {
    "wire": set(),
    "base": set(),
    "firmware": {"wire"},
    "sim": {"base", "firmware", "wire"},
    "device": {"base", "firmware", "sim", "wire"},
    "client": {"wire"},
    "traces": set(),
    # the tier manager decodes the compressed blocks it reads back as a GPU would, with the
    # block format's one definition (firmware.quant's pure code, as replay and tools use it)
    "llm": {"base", "client", "firmware", "wire"},
    # the torture kit checks the drive's compressed blocks byte for byte against the
    # firmware's own output (its pure code, as replay uses it): a client's reference
    "tools": {"base", "client", "firmware", "wire"},
    "replay": {"llm", "base", "client", "firmware", "sim", "tools", "traces", "wire"},
    "bench": {"llm", "base", "client", "device", "firmware", "replay", "sim", "tools", "traces",
              "wire"},
    "cli": {"llm", "base", "bench", "client", "device", "firmware", "replay", "sim", "tools",
            "traces", "wire"},
}
# the cffi modules (c/cffi_build.py, ssdemu_wire/build_ring.py): named like any module, so
# that an import of one is checked like an import of its package
COMPILED = {"ssdemu.device._device", "ssdemu.sim._model", "ssdemu.bench._client_loop",
            "ssdemu.bench._engine_bench", "ssdemu_wire._ring"}


def layer(name: str) -> str:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYER_OF:
            return LAYER_OF[".".join(parts[:n])]
    raise KeyError(f"{name} is in no layer: add its package to LAYER_OF")


def module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """Module -> the modules of ours it names in any import statement."""
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


def resolve(graph, name: str) -> str:
    """`from a import b` names a module a.b or a name in a: the module that exists."""
    if name in graph or name in COMPILED:
        return name
    return name.rsplit(".", 1)[0] if "." in name else name


def violations(graph) -> list[str]:
    out = []
    for m, deps in graph.items():
        for d in deps:
            target = resolve(graph, d)
            lm, ld = layer(m), layer(target)
            if ld != lm and ld not in MAY_IMPORT[lm]:
                out.append(f"{m} ({lm}) imports {target} ({ld})")
    return sorted(out)


def package_cycles(graph) -> list[tuple[str, str]]:
    """Pairs of packages that import each other, directly or through others."""
    pkg = {}
    for m, deps in graph.items():
        pkg.setdefault(layer(m), set()).update(layer(resolve(graph, d)) for d in deps)
    reach = {p: set(d) - {p} for p, d in pkg.items()}
    changed = True
    while changed:
        changed = False
        for p in reach:
            more = set().union(*(reach.get(q, set()) for q in reach[p])) - reach[p]
            if more:
                reach[p] |= more
                changed = True
    return sorted((a, b) for a in reach for b in reach[a] if a < b and a in reach.get(b, ()))


def test_every_module_is_in_a_layer_and_the_layers_hold():
    graph = imports()
    assert "ssdemu.device.daemon" in graph and "hostlib.client" in graph
    for m in graph:
        layer(m)
    assert violations(graph) == []


def test_no_cycle_between_packages():
    assert package_cycles(imports()) == []


def test_the_check_sees_a_planted_violation():
    """A device module importing the client, a timing-model module loading the device's
    compiled module, the wire format importing anything, and a cycle: each caught."""
    graph = imports()
    graph["ssdemu.device.daemon"] = graph["ssdemu.device.daemon"] | {"hostlib.client"}
    graph["ssdemu.sim.timing"] = graph["ssdemu.sim.timing"] | {"ssdemu.device._device"}
    graph["ssdemu_wire.layout"] = graph["ssdemu_wire.layout"] | {"firmware.quant"}
    found = violations(graph)
    assert "ssdemu.device.daemon (device) imports hostlib.client (client)" in found
    assert "ssdemu.sim.timing (sim) imports ssdemu.device._device (device)" in found
    assert "ssdemu_wire.layout (wire) imports firmware.quant (firmware)" in found
    assert ("device", "sim") in package_cycles(graph)


def test_every_compiled_module_is_listed():
    """COMPILED names every cffi module the builders make, so none is missed by the check."""
    built = set()
    for builder in (ROOT / "c" / "cffi_build.py", ROOT / "ssdemu_wire" / "build_ring.py"):
        for node in ast.walk(ast.parse(builder.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "builder":
                built.add(node.args[0].value)
    assert built == COMPILED


def test_model_mode_replay_loads_no_liburing():
    """A model-mode replay runs with nothing linked to liburing in the process: the timing
    model is its own compiled module (ssdemu.sim._model)."""
    code = """
import json, sys
from ssdemu.replay.job import ReplayJob, run
from traces.mooncake import SAMPLE
report = run(ReplayJob(trace=str(SAMPLE), profile="star2000d", model="tiny", mode="model",
                       quant="int8_g64", capacity="hbm=0,dram=0,drive=unbounded",
                       requests=50, progress=False))
assert report["requests"] == 50, report["requests"]
maps = open("/proc/self/maps").read()
print(json.dumps({"liburing": "liburing" in maps, "device": "ssdemu.device._device" in
                  sys.modules, "model": "_model." in maps}))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == (
        '{"liburing": false, "device": false, "model": true}')
