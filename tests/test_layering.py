"""The Python packages' import structure, checked from the source with `ast`.

horovodlike.common is layered (horovodlike/common/__init__.py says why):

    launch_contract <- exceptions <- engine <- bootstrap <- basics <- process_sets
               <- request <- ops, arguments <- objects, dynamic_sets, elastic <- api

A module imports only from layers below its own, at module level or inside a function
alike: a function-level import is a dependency too, it only fails later. Nothing in the
packages below may form an import cycle, and the framework-free core imports neither a
framework binding nor the launcher.
"""
import ast
import pathlib
import re
import shutil
import subprocess

import pytest

from horovodlike._build_engine import ENGINE_DIRS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("horovodlike",)

# Lowest first. Modules on one line may not import each other.
COMMON_LAYERS = [
    ["launch_contract"],
    ["exceptions", "jobkey", "compression", "affinity", "pipeline_schedule",
     "serialization", "slurm",
     "mpi_init"],
    ["engine", "store"],
    ["launch_env"],
    ["bootstrap", "mpi_end"],
    ["basics"],
    ["process_sets"],
    ["request"],
    ["ops", "arguments"],
    ["objects", "dynamic_sets", "elastic", "autotune"],
    ["api", "topology"],
]

# Packages whose modules must not form a cycle.
ACYCLIC = ("horovodlike.common", "horovodlike.torch", "horovodlike.tensorflow",
           "horovodlike.keras", "horovodlike.runner", "horovodlike.timeline_viewer")


def _modules():
    """{dotted module name: path} for every module of PACKAGES."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name):
    """The module of ours that importing `name` loads last (a.b.c -> a.b if c is not a
    module), or None if it is not ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module, tree=None):
    """Our modules that `module` imports anywhere in its source, with line numbers:
    {imported module: first line}."""
    path = MODULES[module]
    tree = tree or ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            # `from pkg import mod` imports pkg.mod; `from mod import name` imports mod.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        for name in names:
            dep = _known(name)
            if dep and dep != module and not module.startswith(dep + "."):
                found.setdefault(dep, node.lineno)
    return found


def graph():
    return {m: imports_of(m) for m in MODULES}


def _cycles(g):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
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

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_every_common_module_has_a_layer():
    placed = {f"horovodlike.common.{m}" for layer in COMMON_LAYERS for m in layer}
    actual = {m for m in MODULES if m.startswith("horovodlike.common.")}
    assert actual - placed == set(), "put the new module in COMMON_LAYERS"
    assert placed - actual == set(), "COMMON_LAYERS names a module that does not exist"


def test_common_imports_only_downward():
    layer = {f"horovodlike.common.{m}": i for i, names in enumerate(COMMON_LAYERS)
             for m in names}
    bad = []
    for module, level in layer.items():
        for dep, line in imports_of(module).items():
            if dep in layer and layer[dep] >= level:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {dep} "
                           f"(layer {layer[dep]}, its own is {level})")
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_common_is_framework_and_launcher_free():
    outside = ("horovodlike.runner", "horovodlike.torch", "horovodlike.tensorflow",
               "horovodlike.keras", "horovodlike.ray")
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {dep}"
           for m in MODULES if m.startswith("horovodlike.common")
           for dep, line in imports_of(m).items() if dep.startswith(outside)]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    g = graph()
    sub = {m: [d for d in deps if d.startswith(ACYCLIC)]
           for m, deps in g.items() if m.startswith(ACYCLIC)}
    assert _cycles(sub) == []


def test_torch_optimizers_do_not_import_functions():
    # functions.py (broadcast_parameters, broadcast_optimizer_state) sits above the
    # optimizers; the optimizer steps through its own _local_step().
    for m in ("horovodlike.torch.optimizer", "horovodlike.torch.sharded"):
        assert "horovodlike.torch.functions" not in imports_of(m), m


def _contract_names():
    from horovodlike.common import launch_contract
    return {v for k, v in vars(launch_contract).items()
            if k.isupper() and isinstance(v, str) and v.startswith("HOROVOD")}


def test_launch_contract_names_are_spelled_once():
    """Every variable a launcher and its ranks share is named by common/launch_contract
    alone: a string literal elsewhere that is exactly one of its names (an environ
    lookup, a dict key) is a second spelling. Docstrings and messages may mention them."""
    names = _contract_names()
    assert {"HOROVODLIKE_STORE_ADDR", "HOROVOD_RANK", "HOROVODLIKE_START_TIMEOUT"} <= names
    bad = []
    for module, path in MODULES.items():
        if module == "horovodlike.common.launch_contract":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
            elif isinstance(node, ast.keyword) and node.arg in names:    # dict(NAME=...)
                bad.append(f"{path.relative_to(ROOT)}:{node.value.lineno} {node.arg}")
    assert not bad, "use launch_contract's constant:\n" + "\n".join(bad)


def _private_uses(module, tree):
    """Private names (_x) of our other modules that `module` uses: imported by name
    (from .m import _x) or read through the module (m._x)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[:len(base) - (node.level - 1)]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if _known(base) is None:
                continue                          # not one of ours
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {base}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} "
                         f"{aliases[node.value.id]}.{node.attr}")
    return found


LAUNCHERS = ("horovodlike.runner", "horovodlike.ray", "horovodlike.spark")


def test_the_launchers_use_each_others_public_names_only():
    """The elastic driver is built on launch's public pieces, and no launcher module
    (horovodlikerun, Ray, Spark) reaches into another's (or the core's) private names."""
    bad = [use for m, path in MODULES.items() if m.startswith(LAUNCHERS)
           for use in _private_uses(m, ast.parse(path.read_text(), str(path)))]
    assert not bad, "\n".join(bad)
    # The checker sees both forms.
    assert _private_uses("horovodlike.runner.elastic_driver", ast.parse(
        "from . import launch\nfrom .launch import _Output\nlaunch._install_handlers(f)\n"
        "from horovodlike.runner.run_fn import _user_path\nfrom os import _exit\n"
    )) == ["horovodlike/runner/elastic_driver.py:2 horovodlike.runner.launch._Output",
           "horovodlike/runner/elastic_driver.py:4 horovodlike.runner.run_fn._user_path",
           "horovodlike/runner/elastic_driver.py:3 "
           "horovodlike.runner.launch._install_handlers"]


@pytest.mark.parametrize("source, expect", [
    ("def f():\n    from . import api\n", True),            # a function-level import
    ("from horovodlike.common import api\n", True),
    ("from .api import init\n", True),
    ("import horovodlike.common.api\n", True),
    ("from . import exceptions\n", False),
])
def test_the_checker_sees_every_form_of_import(source, expect):
    deps = imports_of("horovodlike.common.basics", ast.parse(source))
    assert ("horovodlike.common.api" in deps) is expect


def test_the_checker_finds_cycles():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


# ---- The C engine's folders ----

ENGINE = ROOT / "engine"
FOLDERS = set(ENGINE_DIRS)   # the folders the build compiles; a file elsewhere is never built
# What the files of a folder may include (besides their own folder). Unlisted folders (the
# engine's own: core, control, control/segment) may include any. Entries are folders, or
# folder/header for a single header.
MAY_INCLUDE = {
    "include": set(),
    "util": {"include"},
    # An algorithm sees its context and the transport interface, never the engine.
    "coll": {"include", "util", "transport/transport.h"},
    # The point-to-point channel is not negotiated: nothing of control/.
    "p2p": {"include", "util", "coll", "core", "transport"},
}
# Headers nothing outside their folder may include, and who may anyway.
ONLY_FROM = {"p2p": {"core"}}   # the engine starts and stops the channel; no one else uses it


def _engine_files():
    return sorted(p for p in ENGINE.rglob("*.[ch]"))


def _folder(path):
    return path.parent.relative_to(ENGINE).as_posix()


def _c_includes(path):
    """[(line, header name)] of the file's `#include "..."` lines."""
    return [(n, m.group(1)) for n, line in enumerate(path.read_text().splitlines(), 1)
            if (m := re.match(r'\s*#\s*include\s+"([^"]+)"', line))]


def _headers():
    """{header name: its path}; every folder is on the include path, so names are unique."""
    out = {}
    for p in _engine_files():
        if p.suffix == ".h":
            assert p.name not in out, f"two headers named {p.name}: {out[p.name]} and {p}"
            out[p.name] = p
    return out


def _include_problems(files):
    """What crosses a boundary, for files given as (path, its folder)."""
    headers, bad = _headers(), []
    for path, folder in files:
        for line, name in _c_includes(path):
            where = f"{folder}/{path.name}:{line} includes {name}"
            if name not in headers:
                bad.append(f"{where}, which is no header of the engine")
                continue
            target = _folder(headers[name])
            if target == folder:
                continue
            allowed = MAY_INCLUDE.get(folder)
            if allowed is not None and target not in allowed and f"{target}/{name}" not in allowed:
                bad.append(f"{where} ({target}/): {folder}/ may include only {sorted(allowed)}")
            if target in ONLY_FROM and folder not in ONLY_FROM[target]:
                bad.append(f"{where}: only {sorted(ONLY_FROM[target])} may use {target}/")
    return bad


def test_every_engine_file_is_in_a_known_folder():
    stray = [str(p.relative_to(ROOT)) for p in _engine_files() if _folder(p) not in FOLDERS]
    assert not stray, "put these in a folder of the tree (and in ENGINE_DIRS): " + ", ".join(stray)
    assert [p.name for p in (ENGINE / "include").iterdir()] == ["horovodlike.h"], \
        "include/ holds the one public header"


def test_engine_folders_include_only_downward():
    bad = _include_problems([(p, _folder(p)) for p in _engine_files()])
    assert not bad, "includes across the engine's boundaries:\n" + "\n".join(bad)


@pytest.mark.parametrize("folder, header, crosses", [
    ("coll", "engine.h", True), ("coll", "net.h", True), ("coll", "loop.h", True),
    ("coll", "transport.h", False), ("coll", "util.h", False),
    ("util", "context.h", True), ("p2p", "control.h", True), ("control", "p2p.h", True),
    ("core", "p2p.h", False), ("core", "nonesuch.h", True),
])
def test_the_include_checker_sees_a_boundary_crossed(tmp_path, folder, header, crosses):
    src = tmp_path / "x.c"
    src.write_text(f'#include "{header}"\n')
    assert bool(_include_problems([(src, folder)])) is crosses


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_coll_compiles_without_the_engine():
    # The compiler's side of the boundary: scripts/check_boundaries.sh (seconds).
    res = subprocess.run(["bash", str(ROOT / "scripts" / "check_boundaries.sh")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
