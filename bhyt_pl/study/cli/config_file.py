"""``--config study.yaml``: a study described by a YAML file, every flag settable, the command line overriding it.

The file is a mapping from option names (``lrs`` or ``--lrs``; ``seq_len`` or ``seq-len``) to values, as the
``fit`` recipes are. It is read into command-line words put before the real ones, so argparse converts them
exactly as it does the flags', and a flag given on the command line wins because argparse keeps an option's last
occurrence. Several ``--config`` files apply in order. Each value is first converted here with its option's own
type and choices, so that a bad one is named by the file and key that hold it (``study.yaml: steps: 'many' is
not an integer``), not by the flag it became; an unknown key is named with the nearest accepted one.

Example (``recipes/study/slurm.yaml``)::

    launcher: slurm
    partition: gpu
    timeout_min: 240
    lrs: [1.0e-3, 3.0e-3, 1.0e-2]
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bhyt_pl.errors import UsageError

__all__ = ["CONFIG_FLAG", "expand_config_files"]

CONFIG_FLAG = "--config"


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Long option name without dashes, underscores for dashes -> its action (the help and the config excepted)."""
    options = {}
    for action in parser._actions:  # argparse exposes no public list of its actions
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        for flag in action.option_strings:
            if flag.startswith("--") and flag != CONFIG_FLAG:
                options[flag[2:].replace("-", "_")] = action
    return options


def _words(key: str, value: Any, action: argparse.Action, source: str) -> list[str]:
    """The command-line words that set ``action`` to ``value``."""
    flag = "--" + key.replace("_", "-")
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise UsageError(f"{source}: {key} must be true or false, got {value!r}")
        return [flag if value else "--no-" + key.replace("_", "-")]
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise UsageError(f"{source}: {key} must be true or false, got {value!r}")
        return [flag] if value else []
    if value is None:
        return []  # the option's default
    many = action.nargs in ("*", "+") or isinstance(action.nargs, int)
    if isinstance(value, dict):
        value = [f"{k}={v}" for k, v in value.items()]  # FIELD=VALUE options (--override, --roles, --sbatch)
    if isinstance(value, list | tuple):
        if not many and not isinstance(action, argparse._AppendAction):
            raise UsageError(f"{source}: {key} takes one value, got the list {list(value)!r}")
        items = [_word(v) for v in value]
        if isinstance(action, argparse._AppendAction):
            return [word for item in items for word in (flag, item)]
        return [flag, *items]
    return [flag, _word(value)]


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


_KINDS = {int: "an integer", float: "a number"}


def _check_values(key: str, value: Any, words: list[str], action: argparse.Action, source: str) -> None:
    """Converts each value word as argparse will (the option's ``type``, then its ``choices``), naming the file and
    key of the first that fails."""
    flag = "--" + key.replace("_", "-")
    for word in (w for w in words if w != flag):
        shown = repr(value) if word == _word(value) else f"{word!r} (in {value!r})"
        try:
            converted = action.type(word) if callable(action.type) else word
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            kind = _KINDS.get(action.type, f"a valid {getattr(action.type, '__name__', 'value')}")
            raise UsageError(f"{source}: {key}: {shown} is not {kind}") from None
        if action.choices is not None and converted not in action.choices:
            accepted = ", ".join(map(str, action.choices))
            raise UsageError(f"{source}: {key}: {shown} is not one of {accepted}")


def expand_config_files(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``--config FILE`` replaced by the words its file stands for, placed first.

    Raises:
        UsageError: a file that cannot be read, is not a YAML mapping, or names an option the command does not
            have (the accepted names are listed), or a value of the wrong shape.
    """
    argv = list(argv)
    files, rest = [], []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == CONFIG_FLAG:
            if i + 1 >= len(argv):
                raise UsageError(f"{CONFIG_FLAG} needs a YAML file")
            files.append(argv[i + 1])
            i += 2
            continue
        if word.startswith(CONFIG_FLAG + "="):
            files.append(word.partition("=")[2])
        else:
            rest.append(word)
        i += 1
    if not files:
        return rest
    options = _options(parser)
    words: list[str] = []
    for name in files:
        path = Path(name)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise UsageError(f"{CONFIG_FLAG} {name}: cannot read it ({exc.strerror or exc})") from exc
        except yaml.YAMLError as exc:
            raise UsageError(f"{CONFIG_FLAG} {name}: not valid YAML ({exc})") from exc
        if data is None:
            continue
        if not isinstance(data, dict):
            raise UsageError(f"{CONFIG_FLAG} {name}: must be a mapping of option names to values")
        unknown = [str(k) for k in data if str(k).lstrip("-").replace("-", "_") not in options]
        if unknown:
            named = []
            for key in unknown:
                near = difflib.get_close_matches(key.lstrip("-").replace("-", "_"), list(options), n=1)
                named.append(key + (f" (did you mean {near[0]}?)" if near else ""))
            raise UsageError(
                f"{name}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(named)}; accepted keys: "
                f"{', '.join(sorted(options))}"
            )
        for key, value in data.items():
            key = str(key).lstrip("-").replace("-", "_")
            key_words = _words(key, value, options[key], name)
            _check_values(key, value, key_words, options[key], name)
            words += key_words
    return words + rest
