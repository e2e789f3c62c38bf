"""MkDocs hook: the pages' generated parts, rendered from the code at build time, never copied into the docs.

A page asks for a part with an HTML comment on a line of its own; the hook replaces it before Markdown runs:

- ``<!-- generated: cli-help fit -->``: the ``--help`` of ``python -m bhyt_pl fit`` (any tool and subcommand:
  ``cli-help study confirm``), from the parser the command line itself builds;
- ``<!-- generated: module-help bhyt_pl.bench.gpu -->``: the ``--help`` of ``python -m bhyt_pl.bench.gpu``, a module
  whose ``main(argv)`` parses its own command line;
- ``<!-- generated: scheme-signature bhyt -->``: the registered scheme's constructor, its arguments and defaults,
  from ``inspect.signature`` of the class ``--model.norm bhyt`` builds.

An unknown part is an error, so ``mkdocs build --strict`` fails rather than publish a page with a hole.
Hand-written here (not mkdocs-gen-files): two small renderers need no plugin, and nothing here reaches the network.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import re
import sys

MARKER = re.compile(r"^<!-- generated: ([\w-]+) (.+?) -->$", re.M)
HELP_COLUMNS = "100"
"""argparse wraps help text at ``$COLUMNS``: fixed, so a build gives the same page on every terminal."""


@functools.cache
def cli_help(command: str) -> str:
    """What ``python -m bhyt_pl COMMAND --help`` prints, run in this process (each tool's ``main(argv)``)."""
    from bhyt_pl.cli import main

    return _help(main, command.split(), "python -m bhyt_pl", f"cli-help {command}")


@functools.cache
def module_help(module: str) -> str:
    """What ``python -m MODULE --help`` prints, from the module's ``main(argv)``."""
    import importlib

    return _help(importlib.import_module(module).main, [], f"python -m {module}", f"module-help {module}")


def _help(main, argv: list[str], prog: str, part: str) -> str:  # noqa: ANN001  (a tool's main)
    out = io.StringIO()
    saved_argv, columns = sys.argv, os.environ.get("COLUMNS")
    sys.argv, os.environ["COLUMNS"] = [prog], HELP_COLUMNS  # the prog name; no mkdocs flags
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*argv, "--help"])
    finally:
        sys.argv = saved_argv
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    text = out.getvalue().rstrip()
    if not text.startswith("usage:"):
        raise ValueError(f"generated: {part}: --help printed no usage line")
    return f"```text\n{text}\n```"


def scheme_signature(name: str) -> str:
    """The constructor of the scheme registered as ``name``: one argument a line, with its type and default."""
    from bhyt_pl.norms import build_norm_scheme, registered_norms

    if name not in registered_norms():
        known = ", ".join(registered_norms())
        raise ValueError(f"generated: scheme-signature {name}: not a registered scheme ({known})")
    cls = type(build_norm_scheme(name))
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    if not params:
        return f"```python\n{cls.__name__}()  # --model.norm {name}: no arguments\n```"
    lines = [f"    {p.name}: {_annotation(p)}{'' if p.default is p.empty else f' = {p.default!r}'}," for p in params]
    return f"```python\n{cls.__name__}(  # --model.norm {name}\n" + "\n".join(lines) + "\n)\n```"


def _annotation(parameter: inspect.Parameter) -> str:
    """The annotation as written in the source (a string under ``from __future__ import annotations``)."""
    annotation = parameter.annotation
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


RENDERERS = {"cli-help": cli_help, "module-help": module_help, "scheme-signature": scheme_signature}


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001  (MkDocs' hook signature)
    def render(match: re.Match) -> str:
        kind, argument = match.group(1), match.group(2)
        if kind not in RENDERERS:
            raise ValueError(f"{page.file.src_uri}: unknown generated part {kind!r} (known: {', '.join(RENDERERS)})")
        return RENDERERS[kind](argument)

    return MARKER.sub(render, markdown)
