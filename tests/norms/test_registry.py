"""The registry: the package's schemes found from their source, errors that name the field and the accepted
values, name clashes, and what every packaged scheme ships with (a section of docs/reference/schemes.md and a line
of the README's list linking to it, a recipe overlay).

The per-scheme behaviour checks (float64 reference, KV cache, state dict, hparams round trip, optimizer groups,
...) are ``tests/scheme_checks.py``'s, run on every registered scheme by ``tests/norms/test_schemes.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from bhyt_pl import LlamaConfig
from bhyt_pl.norms import NormScheme, build_norm_scheme, register_norm, registered_norms
from bhyt_pl.norms.base import scheme_class

ROOT = Path(__file__).resolve().parents[2]


def _registered_in_source() -> dict[str, str]:
    """``@register_norm("name")`` decorators in ``bhyt_pl/norms/*.py``, read with ``ast``: name -> module."""
    found = {}
    for path in sorted((ROOT / "bhyt_pl" / "norms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register_norm":
                        found[d.args[0].value] = f"bhyt_pl.norms.{path.stem}"
    return found


PACKAGED = sorted(_registered_in_source())
"""The package's own schemes (tests register their own on top)."""


def test_importing_the_package_registers_every_scheme_its_source_declares() -> None:
    registered = {n: scheme_class(n).__module__ for n in registered_norms() if n in _registered_in_source()}
    assert registered == _registered_in_source() and len(PACKAGED) > 10
    assert {n for n in registered_norms() if scheme_class(n).__module__.startswith("bhyt_pl.")} == set(PACKAGED)


@pytest.mark.parametrize("norm", PACKAGED)
def test_every_packaged_scheme_has_a_reference_section_a_readme_line_and_a_recipe_overlay(norm: str) -> None:
    """docs/reference/schemes.md documents it (a section, where the site renders its signature), the README's list
    links to that section, and ``--config recipes/norms/<name>.yaml`` selects it."""
    reference = (ROOT / "docs" / "reference" / "schemes.md").read_text()
    assert re.search(rf"^## {re.escape(norm)}\n", reference, flags=re.M), f"docs/reference/schemes.md: no `## {norm}`"
    signature = f"<!-- generated: scheme-signature {norm} -->"
    assert signature in reference, f"docs/reference/schemes.md: no {signature}"
    readme = (ROOT / "README.md").read_text()
    link = rf"^- \[`{re.escape(norm)}`\]\(docs/reference/schemes\.md#{re.escape(norm)}\): "
    assert re.search(link, readme, flags=re.M), f"README.md: no line linking `{norm}` to its section"
    overlay = ROOT / "recipes" / "norms" / f"{norm}.yaml"
    assert overlay.exists(), f"no recipe overlay {overlay.relative_to(ROOT)}"
    assert yaml.safe_load(overlay.read_text())["model"]["norm"] == norm


def test_unknown_name_lists_registered() -> None:
    with pytest.raises(ValueError, match=r"unknown norm 'rms_norm'; registered norms: .*bhyt.*rmsnorm"):
        build_norm_scheme("rms_norm")
    with pytest.raises(ValueError, match="unknown norm 'nope'"):
        LlamaConfig.from_name("tiny", norm="nope")


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("bhyt", {"lambda_attn": -1.0}, r"lambda_attn must be > 0, got -1.0"),
        ("bhyt", {"lambda_mlp": 0.0}, r"lambda_mlp must be > 0"),
        ("bhyt", {"lambda_final": -0.5}, r"lambda_final must be >= 0"),
        ("bhyt", {"p": 1.0}, r"p must be in \(0, 1\)"),
        ("bhyt_exact", {"p": 0.0}, r"p must be in \(0, 1\)"),
        ("bhyt", {"stat": "std"}, r"stat must be one of rms, meanstd; got 'std'"),
        ("bhyt", {"kappa": -2.0}, r"kappa must be > 0"),
        ("bhyt", {"seq_len": 0}, r"seq_len must be a positive int"),
        ("dyt", {"alpha_attn": 0.0}, r"alpha_attn must be > 0"),
        ("lns", {"base": "batchnorm"}, r"base must be one of rmsnorm, layernorm; got 'batchnorm'"),
        ("rmsnorm", {"eps": 0.0}, r"eps must be > 0"),
        ("derf", {"alpha_mlp": -0.1}, r"invalid 'derf' norm configuration:\n  - alpha_mlp must be > 0, got -0.1"),
        ("dyisru", {"beta_init": 0.0}, r"beta_init must be > 0 or None \(for d\), got 0.0"),
        ("seednorm", {"eps": -1.0}, r"invalid 'seednorm' norm configuration:\n  - eps must be > 0"),
        ("post_ln", {"eps": 0.0}, r"invalid 'post_ln' norm configuration:\n  - eps must be > 0"),
        ("mix_ln", {"alpha": 1.5}, r"alpha must be in \[0, 1\], got 1.5"),
        ("reordered", {"eps": 0.0}, r"invalid 'reordered' norm configuration:\n  - eps must be > 0"),
        ("hybridnorm", {"eps": -1.0}, r"invalid 'hybridnorm' norm configuration:\n  - eps must be > 0"),
        ("ssnorm", {"eps": 0.0}, r"invalid 'ssnorm' norm configuration:\n  - eps must be > 0"),
        ("gpas", {"eps": 0.0}, r"invalid 'gpas' norm configuration:\n  - eps must be > 0"),
    ],
)
def test_bad_values_name_the_field(name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_norm_scheme(name, **kwargs)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ValueError, match=r"(?s)lambda_attn.*p must be.*stat must be"):
        build_norm_scheme("bhyt", lambda_attn=-1.0, p=2.0, stat="x")


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="lambda_atn"):
        build_norm_scheme("bhyt", lambda_atn=1.0)


def test_register_rejects_non_schemes_and_name_clashes() -> None:
    with pytest.raises(TypeError, match="NormScheme subclass"):
        register_norm("x")(object)

    class Other(NormScheme):
        pass

    with pytest.raises(ValueError, match="'rmsnorm' is already registered"):
        register_norm("rmsnorm")(Other)
