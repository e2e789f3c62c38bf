"""The package's import graph points down: no module imports a higher layer, and there is no cycle.

Imports are read with ``ast`` from every module, function-level and ``TYPE_CHECKING`` imports included
(a lazy import is still a dependency), and so is a string that names a ``bhyt_pl`` module (``"bhyt_pl.study"``
for ``importlib.import_module``): a module that loads another by name depends on it as much as one that
imports it. The layer order is written out here, lowest first; a module belongs to the layer of its longest
listed prefix, and may import its own layer or lower ones.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bhyt_pl"
MODULE_NAME = re.compile(r"bhyt_pl(?:\.\w+)+")

LAYERS: list[tuple[str, ...]] = [
    # foundations: no bhyt_pl import above this line
    (
        "bhyt_pl._version",
        "bhyt_pl.lazy",
        "bhyt_pl.errors",
        "bhyt_pl.interpreter",
        "bhyt_pl.optional",
        "bhyt_pl.machine",
        "bhyt_pl.validation",
        "bhyt_pl.strict_json",
        "bhyt_pl.tensors",
        "bhyt_pl.loss",
        "bhyt_pl.init",
        "bhyt_pl.optim",
        "bhyt_pl.runs",
        "bhyt_pl.run_facts",
        "bhyt_pl.source_bundle",
        "bhyt_pl.disk_full",
        "bhyt_pl.checkpoint_io",
        "bhyt_pl.distributed",
        "bhyt_pl.data",
    ),
    ("bhyt_pl.norms",),  # the schemes: nothing above them
    ("bhyt_pl.config", "bhyt_pl.variants"),  # a model described; a scheme variant parsed (bench and study)
    ("bhyt_pl.run_config", "bhyt_pl.hf_config"),  # a run's config bound; HF names
    ("bhyt_pl.model",),
    ("bhyt_pl.model_size", "bhyt_pl.flops"),  # how big a model is (a meta-device build); what it costs
    ("bhyt_pl.parallelize", "bhyt_pl.checkpoint", "bhyt_pl.hf_modeling"),
    ("bhyt_pl.callbacks", "bhyt_pl.convert"),
    ("bhyt_pl.module", "bhyt_pl.eval"),
    ("bhyt_pl.failures", "bhyt_pl.watchdog"),  # how the command line reports a failed run; a hung one ends
    # the study, in the order of its pipeline: design and rules, one run, where runs execute, the record, the report,
    # and the command line with its driver and kinds (the package root and ``__main__`` are the entry point)
    ("bhyt_pl.study.protocol",),
    ("bhyt_pl.study.run",),
    ("bhyt_pl.study.launch",),
    ("bhyt_pl.study.record",),
    ("bhyt_pl.study.report",),
    ("bhyt_pl.study.cli", "bhyt_pl.study"),
    ("bhyt_pl.compare",),  # runs of fits and of studies (a study's record through the study's own loader)
    ("bhyt_pl.bench",),  # measures everything below it, a study run included (bench --parts study_run)
    ("bhyt_pl", "bhyt_pl.__main__", "bhyt_pl.cli"),  # the package root re-exports; the entry point and the CLI,
    # which loads every tool (eval, bench, study, ...) by name
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PATHS = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, source: str) -> set[str]:
    """The ``bhyt_pl`` modules that module ``name`` (with this ``source``) imports anywhere, or names in a
    string (a dotted name inside the package: the module itself, or the module that defines the attribute)."""
    package = name if PATHS.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import submodule`` depends on the submodule, ``from mod import name`` on the module
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in PATHS else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            candidates = [node.value]
        else:
            continue
        for target in candidates:
            while target and target not in PATHS:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def package_imports() -> dict[str, set[str]]:
    """Each ``bhyt_pl`` module -> the ``bhyt_pl`` modules it depends on (``imports_of``)."""
    return {name: imports_of(name, path.read_text()) for name, path in PATHS.items()}


def layer_of(module: str) -> int:
    matches = [
        (len(prefix), i)
        for i, layer in enumerate(LAYERS)
        for prefix in layer
        if module == prefix or (prefix != PACKAGE.name and module.startswith(prefix + "."))  # the root: itself only
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
    return max(matches)[1]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


GRAPH = package_imports()


def test_the_reader_sees_function_level_and_type_checking_imports() -> None:
    assert "bhyt_pl.callbacks" in GRAPH["bhyt_pl.module"]  # imported inside configure_callbacks
    assert "bhyt_pl.norms.base" in GRAPH["bhyt_pl.norms.bhyt"]
    assert "bhyt_pl.model" in GRAPH["bhyt_pl.parallelize"]  # a TYPE_CHECKING import counts
    assert {"bhyt_pl.study", "bhyt_pl.bench"} <= GRAPH["bhyt_pl.cli"]  # loaded by name (importlib), in TOOLS
    assert "bhyt_pl.runs" in GRAPH["bhyt_pl.cli"]  # a class path names the module that defines the class


def test_the_source_bundle_knows_no_module_it_bundles() -> None:
    """The export's reading order (configuration, norms, model first) is the caller's import, not a list of
    module names inside the foundation-level bundler, where this test could not see it."""
    assert not {t for t in GRAPH["bhyt_pl.source_bundle"] if t != "bhyt_pl"}
    assert {"bhyt_pl.config", "bhyt_pl.norms.base", "bhyt_pl.norms", "bhyt_pl.model"} <= GRAPH["bhyt_pl.convert"]
    graph = {module: set(targets) for module, targets in GRAPH.items()}  # a hard-coded order of names is seen
    graph["bhyt_pl.source_bundle"] = imports_of("bhyt_pl.source_bundle", 'ORDER = ("bhyt_pl.config", "bhyt_pl.model")')
    assert "bhyt_pl.source_bundle (layer 0) imports bhyt_pl.model (layer 4)" in upward_imports(graph)


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        layer_of(module)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )


def test_no_import_points_up() -> None:
    upward = upward_imports(GRAPH)
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b", "c"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
    ],
)
def test_cycle_finder(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert find_cycle(graph) == expected


def test_the_checks_flag_an_upward_import_and_a_cycle_in_the_real_graph() -> None:
    # a norm reaching up into the sharding layer, and the registry base importing a scheme that imports it
    graph = {module: set(targets) for module, targets in GRAPH.items()}
    graph["bhyt_pl.norms.bhyt"].add("bhyt_pl.parallelize")
    assert upward_imports(graph) == [
        f"bhyt_pl.norms.bhyt (layer {layer_of('bhyt_pl.norms')}) imports bhyt_pl.parallelize "
        f"(layer {layer_of('bhyt_pl.parallelize')})"
    ]
    graph = {module: set(targets) for module, targets in GRAPH.items()}
    graph["bhyt_pl.norms.base"].add("bhyt_pl.norms.rmsnorm")
    assert find_cycle(graph) == ["bhyt_pl.norms.base", "bhyt_pl.norms.rmsnorm", "bhyt_pl.norms.base"]
