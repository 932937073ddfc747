"""The Python packages' import structure, checked from the source with `ast`.

horovodlike.common is layered (horovodlike/common/__init__.py says why):

    exceptions <- engine <- bootstrap <- basics <- process_sets <- request <- ops, arguments
               <- objects, dynamic_sets, elastic <- api

A module imports only from layers below its own, at module level or inside a function
alike: a function-level import is a dependency too, it only fails later. Nothing in the
packages below may form an import cycle, and the framework-free core imports neither a
framework binding nor the launcher.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("horovodlike",)

# Lowest first. Modules on one line may not import each other.
COMMON_LAYERS = [
    ["exceptions", "jobkey", "compression", "affinity", "pipeline_schedule",
     "serialization"],
    ["engine", "store"],
    ["launch_env"],
    ["bootstrap", "mpi_end"],
    ["basics"],
    ["process_sets"],
    ["request"],
    ["ops", "arguments"],
    ["objects", "dynamic_sets", "elastic"],
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
