"""Every registered norm scheme passes the shared per-scheme checks (``tests/scheme_checks.py``), at its
defaults and at the cases its float64 reference lists.

The schemes come from the registry (``registered_norms()``, collected before any test registers its own), so
a new scheme needs no edit here. Its reference is found by a naming convention: a scheme defined in
``bhyt_pl/norms/<module>.py`` has its ``SchemeReference`` in ``tests/norms/test_<module>.py`` as
``REFERENCES[name]``; a scheme without one fails the float64 check, naming the file to add it to.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from reference_model import Case
from scheme_checks import SchemeCase, SchemeChecks

from bhyt_pl.norms import registered_norms
from bhyt_pl.norms.base import scheme_class

HERE = Path(__file__).resolve().parent


def reference_home(norm: str) -> str:
    """The test file that holds ``norm``'s reference: ``tests/norms/test_<module>.py``."""
    return f"tests/norms/test_{scheme_class(norm).__module__.rpartition('.')[2]}.py"


def scheme_cases() -> list:
    """Each registered scheme at its defaults, then at each case its reference lists."""
    params = []
    for norm in registered_norms():
        home = reference_home(norm)
        path = HERE / Path(home).name
        references = importlib.import_module(path.stem).REFERENCES if path.exists() else {}
        reference = references.get(norm)
        cases = [Case(), *(reference.cases if reference else ())]
        for i, c in enumerate(cases):
            case = SchemeCase(norm, c.args, c.overrides, reference, reference_home=home)
            params.append(pytest.param(case, id=f"{norm}-{i}" if i else norm))
    return params


@pytest.fixture(params=scheme_cases())
def case(request: pytest.FixtureRequest) -> SchemeCase:
    return request.param


@pytest.fixture(params=[p for p in scheme_cases() if not (p.values[0].args or p.values[0].overrides)])
def scheme(request: pytest.FixtureRequest) -> SchemeCase:
    """Each registered scheme at its defaults."""
    return request.param


class TestRegisteredSchemes(SchemeChecks):
    """``SchemeChecks`` on every registered scheme."""


def test_every_packaged_scheme_has_a_reference_and_every_reference_a_scheme() -> None:
    """The naming convention holds both ways: no scheme without a reference file entry, no stale entry."""
    missing = [p.values[0].norm for p in scheme_cases() if p.values[0].reference is None]
    assert not missing, f"schemes without a float64 reference: {missing}"
    stale = []
    for path in sorted(HERE.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        stale += [
            f"{path.name}: {name}" for name in getattr(module, "REFERENCES", {}) if name not in registered_norms()
        ]
    assert not stale, f"references of no registered scheme: {stale}"
