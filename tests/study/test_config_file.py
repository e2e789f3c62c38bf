"""``--config study.yaml``: a YAML file of the study's options, read as the flags it stands for; the command line
overrides it; its errors name the file and the option."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bhyt_pl.errors import UsageError
from bhyt_pl.study import main
from bhyt_pl.study.cli.config_file import expand_config_files
from bhyt_pl.study.cli.exploration import parser, prepare

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "study"


def _write(path: Path, data: object) -> str:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def test_a_file_sets_what_its_flags_would(tmp_path: Path) -> None:
    config = _write(
        tmp_path / "study.yaml",
        {
            "quick": True,  # store_true
            "compile": False,  # BooleanOptionalAction
            "lrs": [1.0e-3, 3.0e-3],  # nargs="+", floats
            "seq_len": 32,  # underscores for dashes
            "--batch-size": 4,  # the flag's own spelling
            "override": {"dim": 64},  # FIELD=VALUE items from a mapping
            "schemes": ["rmsnorm", "dyt:alpha_attn=0.5|1.0"],
            "out": "runs/x",
            "launcher": "slurm",
            "sbatch": {"constraint": "a100"},
        },
    )
    flags = ["--quick", "--no-compile", "--lrs", "1e-3", "3e-3", "--seq-len", "32", "--batch-size", "4"]
    flags += ["--override", "dim=64", "--schemes", "rmsnorm", "dyt:alpha_attn=0.5|1.0", "--out", "runs/x"]
    flags += ["--launcher", "slurm", "--sbatch", "constraint=a100"]
    p = parser()
    from_file = p.parse_args(expand_config_files(p, ["--config", config]))
    assert vars(from_file) == vars(parser().parse_args(flags))
    assert from_file.out == Path("runs/x") and from_file.lrs == [1e-3, 3e-3] and from_file.compile is False


def test_the_command_line_overrides_the_file_and_files_apply_in_order(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.yaml", {"steps": 10, "seeds": 2, "lrs": [1e-3, 3e-3], "compile": False})
    second = _write(tmp_path / "b.yaml", {"steps": 20})
    p = parser()
    args = p.parse_args(expand_config_files(p, ["--config", first, f"--config={second}", "--seeds", "5", "--lrs", "1"]))
    assert (args.steps, args.seeds, args.lrs, args.compile) == (20, 5, [1.0], False)
    args = p.parse_args(expand_config_files(p, ["--compile", "--config", first]))  # the file's words go first
    assert args.compile is True


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"stpes": 3}, r"bad.yaml: unknown key stpes \(did you mean steps\?\); accepted keys: .*, steps, "),
        ({"steps": "many"}, "bad.yaml: steps: 'many' is not an integer$"),
        ({"lrs": ["1.0e-3", "fast"]}, r"bad.yaml: lrs: 'fast' \(in \['1.0e-3', 'fast'\]\) is not a number$"),
        ({"launcher": "cloud"}, "bad.yaml: launcher: 'cloud' is not one of pool, local, slurm$"),
        ({"steps": [1, 2]}, "steps takes one value, got the list"),
        ({"quick": "yes"}, "quick must be true or false"),
        ("- steps\n- 3\n", "must be a mapping of option names to values"),
        ("steps: [1,\n", "not valid YAML"),
    ],
)
def test_bad_files_are_one_error_naming_file_and_option(tmp_path: Path, data: object, match: str) -> None:
    config = _write(tmp_path / "bad.yaml", data)
    with pytest.raises(UsageError, match=match) as info:
        expand_config_files(parser(), ["--config", config])
    assert "bad.yaml" in str(info.value)


def test_main_exits_2_on_a_bad_file_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["--config", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert "--config" in capsys.readouterr().err and not out.exists()
    config = _write(tmp_path / "study.yaml", {"steps": "many", "out": str(out)})  # the file and key, not --steps
    assert main(["--config", config]) == 2
    assert capsys.readouterr().err == f"error: {config}: steps: 'many' is not an integer\n" and not out.exists()
    config = _write(tmp_path / "bad.yaml", {"steps": 0, "out": str(out)})  # parsed, then refused by the checks
    assert main(["--config", config]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml") if not p.name.startswith("token-")))
def test_the_shipped_study_recipes_parse(recipe: str) -> None:
    """The exploration's recipes (the token-budget map's, ``token-*.yaml``: tests/study/test_cli_token_budget.py)."""
    setup = prepare(["--config", str(RECIPES / recipe)])
    data = yaml.safe_load((RECIPES / recipe).read_text())
    assert setup.options.launcher == data["launcher"] and setup.budget.steps == data["steps"]
    assert setup.out == Path(data["out"]) and setup.settings.accelerator == data["accelerator"]
    tokens = setup.budget.steps * setup.budget.batch_size * setup.budget.seq_len
    if data["preset"] == "llama-374m":  # the paper's 7.5B tokens per run
        assert abs(tokens - 7.5e9) / 7.5e9 < 1e-4
