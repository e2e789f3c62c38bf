"""One self-contained Python module from the package's own source: what the Hugging Face export ships.

``bundle_source(roots)`` copies the source of each root (a class or function defined in ``bhyt_pl``)
and, recursively, of every ``bhyt_pl`` class, function and constant it names, in an order that
defines base classes, decorators and default values before they are used; the caller may give a reading
order of modules whose definitions come first (the export puts the configuration, the norms and the model
before the transformers shell). This module knows no other ``bhyt_pl`` module: it imports the ones the
roots live in, whatever they are, so it sits below everything it bundles. Imports from other
packages (``torch``, ``transformers``) are kept as import lines; imports of ``bhyt_pl`` disappear,
since what they named is now in the same file. So the exported model runs the very code the package
trains with, without importing ``bhyt_pl``, and a new norm scheme exports without edits here.

Hand-written rather than a packaging tool's: tools that vendor packages (``stickytape``, ``pybundler``)
copy whole modules and keep their import statements, which transformers' remote-code loader then
requires to be importable; here only the definitions a model uses travel.
"""

from __future__ import annotations

import ast
import heapq
import importlib
import inspect
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["BundleError", "bundle_source", "bundled_module"]

PACKAGE = "bhyt_pl"


class BundleError(ValueError):
    """The requested code cannot be written as one self-contained module."""


def bundled_module(module_name: str) -> bool:
    """Whether definitions of this module are copied into a bundle (``bhyt_pl`` and its submodules)."""
    return module_name == PACKAGE or module_name.startswith(PACKAGE + ".")


@dataclass
class _Definition:
    """One top-level statement copied into the bundle."""

    module: str
    name: str
    source: str
    load_time: list[tuple[str, str]] = field(default_factory=list)
    """(module, name) of definitions evaluated while this one is defined (bases, decorators, defaults)."""
    call_time: list[tuple[str, str]] = field(default_factory=list)
    """(module, name) of definitions used only when its functions run."""


class _Names(ast.NodeVisitor):
    """Names a piece of code loads, split into load time and call time; annotations are skipped
    (the bundle starts with ``from __future__ import annotations``, so they are never evaluated)."""

    def __init__(self) -> None:
        self.load_time: list[str] = []
        self.call_time: list[str] = []
        self._in_function = 0

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            (self.call_time if self._in_function else self.load_time).append(node.id)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        self._in_function += 1
        for statement in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(statement)
        self._in_function -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_arg(self, node: ast.arg) -> None:  # parameter annotations
        return


class _Module:
    """The parsed source of one module: its top-level definitions and its import bindings."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.module = importlib.import_module(name)
        try:
            self.source = inspect.getsource(self.module)
        except (OSError, TypeError) as err:
            raise BundleError(f"the source of module {name!r} is not available ({err})") from err
        self.lines = self.source.splitlines()
        self.definitions: dict[str, ast.stmt] = {}
        self.canonical: dict[str, str] = {}
        """Bound name -> the first name of its statement (``A, B = ...`` is copied once, as ``A``)."""
        self.imports: dict[str, tuple[str, str | None, str]] = {}
        """Bound name -> (module, attribute or None, import line)."""
        for node in ast.parse(self.source).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.definitions[node.name] = node
                self.canonical[node.name] = node.name
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                for name in bound:
                    self.definitions[name] = node
                    self.canonical[name] = bound[0]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self._add_import(node)

    def _add_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                target = alias.name if alias.asname else alias.name.split(".")[0]
                line = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                self.imports[bound] = (target, None, line)
            return
        module = self._absolute(node)
        for alias in node.names:
            if module == "__future__":
                continue
            line = f"from {module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
            self.imports[alias.asname or alias.name] = (module, alias.name, line)

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = self.name if hasattr(self.module, "__path__") else self.name.rpartition(".")[0]
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        return f"{base}.{node.module}" if node.module else base

    def segment(self, node: ast.stmt) -> str:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "\n".join(self.lines[first - 1 : node.end_lineno])


class _Bundler:
    def __init__(self, reading_order: Sequence[str] = ()) -> None:
        self.reading_order = tuple(reading_order)
        """Module name prefixes whose definitions come first, in this order; the rest follow."""
        self.modules: dict[str, _Module] = {}
        self.definitions: dict[tuple[str, str], _Definition] = {}
        self.order: list[tuple[str, str]] = []  # discovery order
        self.imports: dict[str, str] = {}  # bound name -> import line
        self.extra: list[str] = []
        self.extra_names: dict[str, str] = {}  # top-level name of an extra source -> its context

    def module(self, name: str) -> _Module:
        if name not in self.modules:
            self.modules[name] = _Module(name)
        return self.modules[name]

    # ------------------------------------------------------------------ resolution
    def resolve(self, module: str, name: str, context: str) -> tuple[str, str] | None:
        """The definition ``name`` means inside ``module``, adding it (and its dependencies) to the
        bundle; None for builtins and locals; external imports become import lines."""
        mod = self.module(module)
        if name in mod.definitions:
            key = (module, mod.canonical[name])
            if key not in self.definitions:
                self.add(*key)
            return key
        if name in mod.imports:
            target, attr, line = mod.imports[name]
            if not bundled_module(target):
                self.add_import(name, line, context)
                return None
            if attr is None:
                raise BundleError(f"{context}: `{line}` imports a {PACKAGE} module as a name; import its members")
            if attr != name:
                raise BundleError(f"{context}: `{line}` renames a {PACKAGE} definition, which a bundle cannot keep")
            return self.resolve_object(target, attr, context)
        return None

    def resolve_object(self, module: str, name: str, context: str) -> tuple[str, str]:
        """``name`` as ``module`` exports it (possibly a re-export of a package ``__init__``)."""
        obj = getattr(importlib.import_module(module), name, None)
        home = getattr(obj, "__module__", None) if inspect.isclass(obj) or inspect.isfunction(obj) else None
        if home and bundled_module(home) and getattr(obj, "__qualname__", name) == name:
            module = home
        key = self.resolve(module, name, context)
        if key is None:
            raise BundleError(f"{context}: cannot find the definition of {name!r} in {module!r}")
        return key

    def add_import(self, name: str, line: str, context: str) -> None:
        if self.imports.get(name, line) != line:
            raise BundleError(f"{context}: {name!r} is imported as `{self.imports[name]}` and as `{line}`")
        self.imports[name] = line

    def add(self, module: str, name: str) -> None:
        mod = self.module(module)
        node = mod.definitions[name]
        definition = _Definition(module, name, "")
        self.definitions[(module, name)] = definition  # before recursing: cycles through call time end here
        source, local_imports = _strip_package_imports(mod.segment(node))
        definition.source = source
        names = _Names()
        names.visit(node)
        context = f"{module}.{name}"
        for bucket, found in ((definition.load_time, names.load_time), (definition.call_time, names.call_time)):
            for used in dict.fromkeys(found):
                if used == name and bucket is definition.call_time:
                    continue  # recursion or a class referring to itself inside its methods
                if used in local_imports:
                    key = self.resolve_object(*local_imports[used], context)
                else:
                    key = self.resolve(module, used, context)
                if key is not None and key != (module, name):
                    bucket.append(key)
        self.order.append((module, name))

    # ------------------------------------------------------------------ output
    def ordered(self) -> list[_Definition]:
        """Definitions in reading order (module by module, in source order: the modules of
        ``reading_order`` first, in its order, then the others by name), moved only where one must come after
        another that is evaluated while it is defined (a base class, a decorator, a default value)."""
        keys = list(self.definitions)
        blocking = {key: set(self.definitions[key].load_time) for key in keys}
        users: dict[tuple[str, str], list[tuple[str, str]]] = {key: [] for key in keys}
        for key, deps in blocking.items():
            for dep in deps:
                users[dep].append(key)
        ready = [self._reading_key(key) for key in keys if not blocking[key]]
        heapq.heapify(ready)
        out: list[_Definition] = []
        while ready:
            *_, key = heapq.heappop(ready)
            out.append(self.definitions[key])
            for user in users[key]:
                blocking[user].discard(key)
                if not blocking[user]:
                    heapq.heappush(ready, self._reading_key(user))
        if len(out) < len(keys):
            stuck = sorted(f"{m}.{n}" for (m, n), deps in blocking.items() if deps)
            raise BundleError(f"definitions depend on each other at import time: {', '.join(stuck)}")
        return out

    def _reading_key(self, key: tuple[str, str]) -> tuple[int, str, int, tuple[str, str]]:
        module, name = key
        order = self.reading_order
        inside = [i for i, prefix in enumerate(order) if module == prefix or module.startswith(prefix + ".")]
        rank = inside[0] if inside else len(order)
        return rank, module, self.modules[module].definitions[name].lineno, key

    def render(self, header: str) -> str:
        definitions = self.ordered()
        seen: dict[str, str] = {}
        for d in definitions:
            if seen.setdefault(d.name, d.module) != d.module:
                raise BundleError(
                    f"two definitions named {d.name!r} ({seen[d.name]} and {d.module}) cannot share a file"
                )
            if d.name in self.imports:
                raise BundleError(f"{d.module}.{d.name} clashes with the import `{self.imports[d.name]}`")
            if d.name in self.extra_names:  # a later definition would silently replace the package's
                raise BundleError(f"{self.extra_names[d.name]} defines {d.name!r}, which {d.module} defines too")
        imports = sorted(set(self.imports.values()), key=lambda line: (line.startswith("from "), line))
        parts = [header.rstrip() + "\n" if header else "", "from __future__ import annotations\n", "\n".join(imports)]
        last_module = None
        for d in definitions:
            if d.module != last_module:
                parts.append(f"# {'-' * 77} from {d.module}")
                last_module = d.module
            parts.append(d.source)
        parts.extend(self.extra)
        return "\n\n\n".join(p.strip("\n") for p in parts if p.strip()) + "\n"


def _strip_package_imports(source: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """Replace ``from bhyt_pl... import X`` statements inside functions by ``pass``; return the
    rewritten source and ``{X: (module, X)}`` for each removed name."""
    tree = ast.parse(textwrap.dedent(source))
    lines = source.splitlines()
    removed: dict[str, tuple[str, str]] = {}
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and bundled_module(node.module):
            for alias in node.names:
                if alias.asname and alias.asname != alias.name:
                    raise BundleError(f"`from {node.module} import {alias.name} as {alias.asname}` cannot be bundled")
                removed[alias.name] = (node.module, alias.name)
            spans.append((node.lineno, node.end_lineno))
        elif isinstance(node, ast.Import) and any(bundled_module(a.name) for a in node.names):
            raise BundleError(
                f"`import {node.names[0].name}` inside a function cannot be bundled; use `from ... import`"
            )
    for first, last in sorted(spans, reverse=True):
        indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
        lines[first - 1 : last] = [f"{indent}pass  # bundled: {', '.join(removed)} defined in this file"]
    return "\n".join(lines), removed


def bundle_source(
    roots: Sequence[Any],
    extra_sources: Iterable[str] = (),
    header: str = "",
    reading_order: Sequence[ModuleType] = (),
) -> str:
    """Python source of one module that defines ``roots`` and all they use from ``bhyt_pl``.

    Args:
        roots: classes and functions defined at the top level of ``bhyt_pl`` modules.
        extra_sources: further module sources appended after the bundle (a user's norm scheme,
            ``NormScheme.export_source``); their ``bhyt_pl`` imports are resolved into the bundle and
            their other imports kept.
        header: text placed first (a module docstring).
        reading_order: modules (a package stands for its submodules) whose definitions come first, in this
            order; definitions of other modules follow. The caller imports them, so the dependency is an
            import the package's layer test reads.

    Raises:
        BundleError: a root outside ``bhyt_pl``, a missing source, two definitions with one name,
            or definitions that need each other at import time.
    """
    bundler = _Bundler([m.__name__ for m in reading_order])
    for root in roots:
        module, name = getattr(root, "__module__", None), getattr(root, "__qualname__", None)
        if not (module and name and bundled_module(module)) or "." in name:
            raise BundleError(f"{root!r} is not a top-level class or function of {PACKAGE}")
        bundler.resolve(module, name, f"{module}.{name}")
    for i, source in enumerate(extra_sources):
        bundler.extra.append(_extra_source(bundler, source, f"extra source #{i}"))
    return bundler.render(header)


def _extra_source(bundler: _Bundler, source: str, context: str) -> str:
    """A whole module's source with its top-level ``bhyt_pl`` imports resolved into the bundle."""
    tree = ast.parse(source)
    lines = source.splitlines()
    drop: list[tuple[int, int]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bundler.extra_names[node.name] = context
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bundler.extra_names.update({n.id: context for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            drop.append((node.lineno, node.end_lineno))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and bundled_module(node.module):
            for alias in node.names:
                if alias.asname and alias.asname != alias.name:
                    raise BundleError(f"{context}: `from {node.module} import {alias.name} as ...` cannot be bundled")
                bundler.resolve_object(node.module, alias.name, context)
            drop.append((node.lineno, node.end_lineno))
        elif isinstance(node, ast.Import) and any(bundled_module(a.name) for a in node.names):
            raise BundleError(f"{context}: `import {PACKAGE}...` cannot be bundled; use `from {PACKAGE}... import`")
    for first, last in sorted(drop, reverse=True):
        del lines[first - 1 : last]
    return "\n".join(lines)
