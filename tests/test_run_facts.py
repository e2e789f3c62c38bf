"""A run's facts are made by one builder, ``build_run_facts``, and its config by one function,
``build_run_config``: the scheme is resolved once, a scheme declares the facts it needs and every entry point
binds them through that function; a new fact declared in a test alone reaches every entry point; fine-tuning
binds the fine-tuning run's T and may turn the final norm into a BHyT site; checkpoints carry a schema
version."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lm_fixtures import TINY_OVERRIDES
from reference_model import vo_constant_ref

import bhyt_pl.norms
import bhyt_pl.run_facts
from bhyt_pl import Llama, LlamaConfig, LlamaLM, load_model
from bhyt_pl.checkpoint import SCHEMA_VERSION, checkpoint_entry
from bhyt_pl.norms import (
    BHyT,
    BHyTScheme,
    BlockNorms,
    NormScheme,
    RMSNorm,
    RMSNormScheme,
    base,
    build_norm_scheme,
    register_norm,
)
from bhyt_pl.norms.bhyt import UNBOUND_SEQ_LEN
from bhyt_pl.run_config import build_run_config, data_run_facts
from bhyt_pl.run_facts import RunSettings, build_run_facts, register_run_fact, registered_run_facts

ROOT = Path(__file__).resolve().parents[1]


class BatchProbeScheme(RMSNormScheme):
    """A scheme with a run fact no entry point names: ``batch_size``, declared here and nowhere else."""

    run_facts = ("batch_size",)

    def __init__(self, eps: float = 1e-5, impl: str = "auto", batch_size: int | None = None) -> None:
        super().__init__(eps, impl)
        self.batch_size = batch_size


@pytest.fixture(autouse=True)
def batch_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """``batch_probe`` registered for this module's tests only (other tests list the registered norms)."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_norm("batch_probe")(BatchProbeScheme)


class TokensProbeScheme(RMSNormScheme):
    """A scheme that needs ``tokens_per_step``, a run fact the package does not have: the ``tokens_per_step``
    fixture declares it."""

    run_facts = ("tokens_per_step",)

    def __init__(self, eps: float = 1e-5, impl: str = "auto", tokens_per_step: int | None = None) -> None:
        super().__init__(eps, impl)
        self.tokens_per_step = tokens_per_step

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        norms = super().block_norms(dim, layer_idx, n_layers)
        norms.tokens_per_step = self.tokens_per_step  # what the bench's sites were built with
        return norms


@pytest.fixture
def tokens_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new run fact, declared in this test file alone (tokens per optimizer step on one device), and a scheme
    ``tokens_probe`` that needs it; both registrations are undone after the test."""
    monkeypatch.setattr(bhyt_pl.run_facts, "_FACTS", dict(bhyt_pl.run_facts._FACTS))

    @register_run_fact("tokens_per_step")
    def _tokens_per_step(run: RunSettings) -> int | None:
        return run.seq_len * run.batch_size if run.seq_len and run.batch_size else None

    register_norm("tokens_probe")(TokensProbeScheme)


def assert_model_uses_T(model: Llama, T: int) -> None:
    """Every block's cached c is ||W_V W_O||_F^2 / (T d), recomputed independently in float64."""
    for layer in model.layers:
        assert layer.norms.seq_len == T
        assert float(layer.norms.c) == pytest.approx(vo_constant_ref(layer.attn, T), rel=1e-5)


def write_checkpoint(model: Llama, path: Path, schema_version: int | None = SCHEMA_VERSION) -> Path:
    """A single-file checkpoint in LlamaLM's layout; ``schema_version=None`` writes the format from before
    checkpoints were versioned (no ``schema_version`` key)."""
    entry = checkpoint_entry(model.config, "embedded")
    if schema_version is None:
        del entry["schema_version"]
    else:
        entry["schema_version"] = schema_version
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "bhyt_pl": entry}, path)
    return path


@pytest.fixture
def pretrained(tmp_path: Path) -> Path:
    """A 'pretrained' bhyt checkpoint at T = 32 with non-trivial final-norm gains."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", **TINY_OVERRIDES, norm="bhyt").bind(seq_len=32))
    with torch.no_grad():
        model.final_norm.weight.uniform_(0.5, 1.5)
    return write_checkpoint(model, tmp_path / "pretrained.ckpt")


# ----------------------------------------------------------------------------- the one builder of facts
def test_build_run_facts_gives_every_registered_fact_and_validates_the_settings() -> None:
    assert registered_run_facts() == ["seq_len", "batch_size"]
    assert build_run_facts(seq_len=256, batch_size=8) == {"seq_len": 256, "batch_size": 8}
    assert build_run_facts(seq_len=256) == {"seq_len": 256}  # a fact the settings leave open is absent
    assert build_run_facts() == {}
    with pytest.raises(ValueError, match=r"invalid run settings: seq_len must be a positive int or None, got 0"):
        build_run_facts(seq_len=0)
    with pytest.raises(ValueError, match=r"batch_size must be a positive int or None, got True"):
        build_run_facts(batch_size=True)
    with pytest.raises(ValueError, match=r"run fact 'seq_len' is already registered; registered: seq_len, batch_size"):
        register_run_fact("seq_len")(lambda run: run.seq_len)
    with pytest.raises(ValueError, match=r"a run fact's name must be an identifier"):
        register_run_fact("tokens per step")


def test_a_new_fact_is_one_declaration(tokens_per_step: None) -> None:
    assert registered_run_facts() == ["seq_len", "batch_size", "tokens_per_step"]
    assert build_run_facts(seq_len=64, batch_size=3) == {"seq_len": 64, "batch_size": 3, "tokens_per_step": 192}
    assert build_run_facts(seq_len=64) == {"seq_len": 64}
    # facts given by hand are completed from the settings among them; a value given by hand wins
    config = build_run_config("tiny", "tokens_probe", run_facts={"seq_len": 64, "batch_size": 3})
    assert config.norm_args == {"tokens_per_step": 192}
    config = build_run_config("tiny", "tokens_probe", run_facts={"seq_len": 64, "tokens_per_step": 10})
    assert config.norm_args == {"tokens_per_step": 10}


def test_a_fact_no_builder_declares_is_named_with_the_registered_ones() -> None:
    register_norm("tokens_probe")(TokensProbeScheme)  # the fact itself is not registered here
    with pytest.warns(UserWarning, match=r"declares the run fact\(s\) \['tokens_per_step'\], which no entry point "
                      r"can give: .*register_run_fact; registered run facts: seq_len, batch_size"):  # fmt: skip
        build_run_config("tiny", "tokens_probe", run_facts={"seq_len": 64, "batch_size": 3})


FACT_MAKERS = {
    "bhyt_pl/data/c4.py": "C4DataModule.run_facts",
    "bhyt_pl/data/lima.py": "LIMADataModule.run_facts",
    "bhyt_pl/bench/models.py": "the bench's models",
    "bhyt_pl/bench/sites.py": "the bench's norm sites",
    "scripts/gpu_distributed_check.py": "the GPU script",
}


@pytest.mark.parametrize("path", sorted(FACT_MAKERS))
def test_each_maker_of_facts_calls_the_builder_and_writes_no_fact_by_hand(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "build_run_facts" in called, f"{FACT_MAKERS[path]} must make its run facts with build_run_facts"
    facts = set(registered_run_facts())
    hand_made = [  # a dict of nothing but run facts, such as {"seq_len": seq_len, "batch_size": batch_size}
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and node.keys
        and all(isinstance(k, ast.Constant) and k.value in facts for k in node.keys)
    ]
    assert not hand_made, f"{FACT_MAKERS[path]} makes run facts by hand: {hand_made}"


# ----------------------------------------------------------------------------- the one function
def test_build_run_config_binds_declared_facts_and_ignores_the_rest() -> None:
    facts = {"seq_len": 64, "batch_size": 4, "tokenizer": "embedded"}
    config = build_run_config("tiny", "bhyt", {"lambda_attn": 1.5}, TINY_OVERRIDES, facts)
    assert config.norm_args == {"lambda_attn": 1.5, "seq_len": 64}
    assert config.n_layers == TINY_OVERRIDES["n_layers"] and config.name == "tiny"
    scheme = config.norm_scheme()
    assert isinstance(scheme, BHyTScheme) and scheme.seq_len == 64 and scheme.lambda_attn == 1.5
    assert build_run_config("tiny", "rmsnorm", run_facts=facts).norm_args == {}
    assert build_run_config("tiny", "batch_probe", run_facts=facts).norm_args == {"batch_size": 4}
    # a scheme instance: its arguments become the config's, then the facts are bound
    config = build_run_config("tiny", BHyTScheme(lambda_attn=1.0), run_facts={"seq_len": 40})
    assert config.norm_args["lambda_attn"] == 1.0 and config.norm_args["seq_len"] == 40
    with pytest.raises(ValueError, match="norm_args is only for a norm given by name"):
        build_run_config("tiny", BHyTScheme(), {"lambda_attn": 1.0})
    with pytest.raises(ValueError, match=r"seq_len=600 exceeds the model's max_seq_len=512"):
        build_run_config("tiny", "bhyt", run_facts={"seq_len": 600})


def test_build_run_config_keeps_explicit_facts_and_warns_on_unbound_ones() -> None:
    with pytest.warns(UserWarning, match=r"seq_len=16 is set in the norm arguments and kept; this run's seq_len is 48"):
        config = build_run_config("tiny", "bhyt", {"seq_len": 16}, run_facts={"seq_len": 48})
    assert config.norm_scheme().seq_len == 16
    with pytest.warns(
        UserWarning, match=r"needs the run fact\(s\) \['batch_size'\].*run_facts=\{'batch_size': \.\.\.\}"
    ):
        config = build_run_config("tiny", "batch_probe", run_facts={"seq_len": 48, "batch_size": None})
    assert config.norm_scheme().batch_size is None


def test_the_scheme_is_resolved_once_and_read_from_the_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    resolve = bhyt_pl.norms.build_norm_scheme

    def counting(norm, **kwargs):
        calls.append(norm)
        return resolve(norm, **kwargs)

    monkeypatch.setattr(bhyt_pl.norms, "build_norm_scheme", counting)
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", norm_args={"exact_layers": 1}, seq_len=48)
    lm.configure_model()
    scheme = lm.config.norm_scheme()
    assert calls == ["bhyt"]  # one resolution for the whole run: binding, the model, the trainer read the instance
    assert lm.config.norm_scheme() is scheme and scheme.seq_len == 48 and scheme.exact_layers == 1
    assert [layer.norms.approximate for layer in lm.model.layers] == [False] + [True] * (len(lm.model.layers) - 1)


def test_bind_sets_declared_facts_and_ignores_the_rest() -> None:
    bhyt = build_norm_scheme("bhyt", lambda_attn=1.5)
    assert bhyt.run_facts == ("seq_len",) and bhyt.unbound_run_facts() == ["seq_len"]
    bound = bhyt.bind(seq_len=256, batch_size=8)
    assert bound.seq_len == 256 and bound.lambda_attn == 1.5 and bound.unbound_run_facts() == []
    assert bhyt.seq_len is None  # a copy: the unbound scheme is unchanged
    assert bound.bind(seq_len=256) is bound and bhyt.bind(seq_len=None) is bhyt
    rms = build_norm_scheme("rmsnorm")
    assert rms.run_facts == () and rms.bind(seq_len=256) is rms
    assert build_norm_scheme("batch_probe").bind(seq_len=256, batch_size=8).batch_size == 8


def test_a_scheme_declares_only_constructor_arguments_that_default_to_none_as_run_facts() -> None:
    with pytest.raises(TypeError, match=r"run_facts \['seq_len'\] must be constructor arguments that default to None"):

        @register_norm("no_seq_len_argument")
        class Broken(NormScheme):
            run_facts = ("seq_len",)

            def __init__(self, eps: float = 1e-5) -> None:
                self.eps = eps

    with pytest.raises(TypeError, match=r"run_facts \['batch_size'\] must be constructor arguments"):

        @register_norm("batch_size_not_none")
        class Defaulted(NormScheme):
            run_facts = ("batch_size",)

            def __init__(self, batch_size: int = 8) -> None:
                self.batch_size = batch_size


def test_unbound_bhyt_uses_the_documented_default_T() -> None:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", **TINY_OVERRIDES, norm="bhyt"))
    assert_model_uses_T(model, UNBOUND_SEQ_LEN)
    config = build_run_config("tiny", "bhyt", overrides=TINY_OVERRIDES, run_facts={"seq_len": 48})
    assert config.norm_args == {"seq_len": 48}
    assert_model_uses_T(Llama(config), 48)


def test_a_model_built_unbound_names_its_fallback_and_records_it(tmp_path: Path) -> None:
    """The warning did not say which T the model fell back to, and ``hparams.yaml`` recorded ``norm_args`` without
    it (``{}`` where the model was built with T = 1024)."""
    import lightning as L
    from lightning.pytorch.core.saving import load_hparams_from_yaml
    from lm_fixtures import TokenDataModule

    from bhyt_pl.checkpoint import read_checkpoint, resume_mismatches

    assert UNBOUND_SEQ_LEN == 1024  # the paper's pretraining length, docs/method.md section 9
    with pytest.warns(UserWarning, match=r"needs the run fact\(s\) \['seq_len'\].*falls back to seq_len=1024 \(docs"):
        build_run_config("tiny", "bhyt")
    model = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", norm_args={"lambda_attn": 1.0})
    trainer = L.Trainer(max_steps=1, accelerator="cpu", limit_val_batches=0, default_root_dir=tmp_path,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with pytest.warns(UserWarning, match=r"falls back to seq_len=1024"):
        trainer.fit(model, TokenDataModule(seq_len=32).train_dataloader())  # plain loaders: no run facts
    assert_model_uses_T(model.model, UNBOUND_SEQ_LEN)
    version = tmp_path / "lightning_logs" / "version_0"
    assert load_hparams_from_yaml(version / "hparams.yaml")["norm_args"] == {"lambda_attn": 1.0, "seq_len": 1024}
    (path,) = (version / "checkpoints").glob("*.ckpt")
    saved = read_checkpoint(path)
    assert saved["bhyt_pl"]["model_config"]["norm_args"] == {"lambda_attn": 1.0, "seq_len": 1024}
    # the same run again, unbound until its model is built, resumes it; so does a checkpoint that never recorded T
    again = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", norm_args={"lambda_attn": 1.0})
    assert resume_mismatches(again.config, again.hparams, saved) == []
    del saved["bhyt_pl"]["model_config"]["norm_args"]["seq_len"]
    assert resume_mismatches(again.config, again.hparams, saved) == []
    bound = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", norm_args={"lambda_attn": 1.0}, seq_len=32)
    problems = resume_mismatches(bound.config, bound.hparams, saved)
    assert "model.norm_args.seq_len: checkpoint 1024, this run 32" in problems


def test_data_modules_declare_their_run_facts() -> None:
    from bhyt_pl.data import C4DataModule, LIMADataModule

    assert data_run_facts(C4DataModule.embedded(seq_len=96, batch_size=3)) == {"seq_len": 96, "batch_size": 3}
    lima = LIMADataModule(tokenizer="embedded", max_seq_len=56, batch_size=2)
    assert data_run_facts(lima) == {"seq_len": 56, "batch_size": 2}
    assert data_run_facts(SimpleNamespace(seq_len=96)) == {}  # no guessing at attributes


# ----------------------------------------------------------------------------- every entry point calls it
ENTRY_POINTS = {
    "bhyt_pl/module.py": "LlamaLM (the CLI, fine-tuning and the study build through it)",
    "bhyt_pl/bench/models.py": "the bench's models",
    "bhyt_pl/bench/sites.py": "the bench's norm sites",
    "scripts/gpu_distributed_check.py": "the GPU script",
}


@pytest.mark.parametrize("path", sorted(ENTRY_POINTS))
def test_each_entry_point_calls_the_one_function_and_binds_nothing_itself(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    attributes = {
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert "build_run_config" in called, f"{ENTRY_POINTS[path]} must build its config with build_run_config"
    assert not attributes & {"bind", "from_name"}, f"{ENTRY_POINTS[path]} binds or builds a config itself"


# ----------------------------------------------------------------------------- a new fact reaches every entry point
def _tokens_c4() -> int:
    from bhyt_pl.data import C4DataModule

    return data_run_facts(C4DataModule.embedded(seq_len=96, batch_size=3))["tokens_per_step"]


def _tokens_lima() -> int:
    from bhyt_pl.data import LIMADataModule

    return data_run_facts(LIMADataModule(tokenizer="embedded", max_seq_len=56, batch_size=2))["tokens_per_step"]


def _tokens_cli() -> int:
    from bhyt_pl.cli import main

    args = ["--config", str(ROOT / "recipes/tiny.yaml"), "--data.init_args.seq_len", "96",
            "--data.init_args.batch_size", "3", "--model.norm", "tokens_probe"]  # fmt: skip
    return main(args, run=False).model.config.norm_scheme().tokens_per_step


def _tokens_python() -> int:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="tokens_probe", seq_len=48, run_facts={"batch_size": 4})
    return lm.config.norm_scheme().tokens_per_step


def _tokens_fine_tuning(tmp_path: Path) -> int:
    facts = build_run_facts(seq_len=32, batch_size=2)
    config = build_run_config("tiny", "tokens_probe", overrides=TINY_OVERRIDES, run_facts=facts)
    checkpoint = write_checkpoint(Llama(config), tmp_path / "probe.ckpt")
    sft = LlamaLM(init_checkpoint=str(checkpoint), seq_len=48, run_facts={"batch_size": 7})  # settings by hand
    return sft.config.norm_scheme().tokens_per_step


def _tokens_bench_model() -> int:
    from bhyt_pl.bench.models import build_model
    from bhyt_pl.variants import parse_variant

    cpu = torch.device("cpu")
    model = build_model("tiny", parse_variant("tokens_probe"), {"n_layers": 2}, cpu, torch.float32, 40, 6)
    return model.config.norm_scheme().tokens_per_step


def _tokens_bench_sites() -> int:
    from bhyt_pl.bench.sites import block_norms
    from bhyt_pl.variants import parse_variant

    cpu = torch.device("cpu")
    norms = block_norms(parse_variant("tokens_probe"), 64, 4, cpu, torch.float32, seq_len=40, batch_size=6)
    return norms.tokens_per_step


def _tokens_gpu_script() -> int:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts/gpu_distributed_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.model_config(SimpleNamespace(preset="tiny", seq_len=80, batch=5), "tokens_probe").norm_args[
        "tokens_per_step"
    ]


NEW_FACT_ENTRY_POINTS = {
    "c4-data-module": (_tokens_c4, 96 * 3),
    "lima-data-module": (_tokens_lima, 56 * 2),
    "cli": (_tokens_cli, 96 * 3),
    "python-api": (_tokens_python, 48 * 4),
    "fine-tuning": (_tokens_fine_tuning, 48 * 7),
    "bench-model": (_tokens_bench_model, 40 * 6),
    "bench-sites": (_tokens_bench_sites, 40 * 6),
    "gpu-script": (_tokens_gpu_script, 80 * 5),
}


@pytest.mark.parametrize("entry", sorted(NEW_FACT_ENTRY_POINTS))
def test_a_run_fact_declared_in_this_test_alone_reaches_every_entry_point(
    entry: str, tokens_per_step: None, tmp_path: Path
) -> None:
    """``tokens_per_step`` is declared by the fixture and used by ``tokens_probe``; no package file names it.
    The study, which builds through the data module and ``LlamaLM``, is checked in the study test below."""
    make, expected = NEW_FACT_ENTRY_POINTS[entry]
    got = make(tmp_path) if entry == "fine-tuning" else make()
    assert got == expected


# ----------------------------------------------------------------------------- entry points
def test_python_api_binds_T_and_a_new_fact() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=48)
    lm.configure_model()
    assert lm.config.norm_args["seq_len"] == 48 and lm.hparams["norm_args"]["seq_len"] == 48
    assert_model_uses_T(lm.model, 48)
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm=BHyTScheme(lambda_attn=1.0), seq_len=40)
    assert lm.config.norm_args["seq_len"] == 40 and lm.config.norm_args["lambda_attn"] == 1.0
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="batch_probe", seq_len=48, run_facts={"batch_size": 4})
    assert lm.config.norm_scheme().batch_size == 4 and lm.hparams["norm_args"] == {"batch_size": 4}
    unbound = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt")  # no warning yet: a data module may still bind T
    with pytest.warns(UserWarning, match=r"needs the run fact\(s\) \['seq_len'\]"):
        unbound.configure_model()  # built without one: the scheme's fallback T, said once
    with pytest.raises(ValueError, match=r"seq_len=48 and run_facts\['seq_len'\]=32 differ"):
        LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=48, run_facts={"seq_len": 32})


def test_cli_binds_the_data_modules_facts_into_a_scheme_instance() -> None:
    from bhyt_pl.cli import main

    args = [
        "--config", str(ROOT / "recipes/tiny.yaml"), "--data.init_args.seq_len", "96",
        "--model.norm", "{class_path: bhyt_pl.norms.BHyTScheme, init_args: {lambda_attn: 1.0}}",
    ]  # fmt: skip
    cli = main(args, run=False)
    cli.model.configure_model()
    assert cli.model.config.norm_args["lambda_attn"] == 1.0
    assert_model_uses_T(cli.model.model, 96)
    args = [
        "--config",
        str(ROOT / "recipes/tiny.yaml"),
        "--data.init_args.batch_size",
        "3",
        "--model.norm",
        "batch_probe",
    ]
    cli = main(args, run=False)
    assert cli.model.config.norm_scheme().batch_size == 3


def test_init_checkpoint_binds_the_fine_tuning_runs_T(pretrained: Path) -> None:
    sft = LlamaLM(init_checkpoint=str(pretrained), seq_len=48)
    sft.configure_model()
    assert sft.config.norm_args["seq_len"] == 48
    assert_model_uses_T(sft.model, 48)
    kept = LlamaLM(init_checkpoint=str(pretrained))  # no length given: the checkpoint's T stays
    assert kept.config.norm_args["seq_len"] == 32


def test_init_checkpoint_binds_a_new_fact(tmp_path: Path) -> None:
    config = build_run_config("tiny", "batch_probe", overrides=TINY_OVERRIDES, run_facts={"batch_size": 2})
    probe = write_checkpoint(Llama(config), tmp_path / "probe.ckpt")
    sft = LlamaLM(init_checkpoint=str(probe), run_facts={"seq_len": 48, "batch_size": 7})
    assert sft.config.norm_args == {"batch_size": 7} and sft.config.norm_scheme().batch_size == 7


def test_sft_final_norm_becomes_bhyt_with_the_pretrained_gain(pretrained: Path) -> None:
    source = load_model(pretrained).model
    assert isinstance(source.final_norm, RMSNorm)
    sft = LlamaLM(init_checkpoint=str(pretrained), norm_args={"lambda_final": 3.0}, seq_len=48)
    sft.configure_model()
    final = sft.model.final_norm
    assert isinstance(final, BHyT) and final.stat == "rms"
    torch.testing.assert_close(final.weight, source.final_norm.weight)  # the gain carries over
    assert float(final.lambda_.detach()) == 3.0 and final.lambda_.requires_grad  # lambda starts at lambda_final
    for key, value in source.state_dict().items():
        torch.testing.assert_close(sft.model.state_dict()[key], value)
    x = torch.randn(2, 5, TINY_OVERRIDES["dim"])
    kappa, eps = build_norm_scheme("bhyt").kappa_value, 1e-6
    expected = source.final_norm.weight * torch.tanh(3.0 * x / (kappa * torch.sqrt(x.pow(2).mean(-1, True) + eps)))
    torch.testing.assert_close(final(x), expected)


def test_init_checkpoint_stays_strict_about_every_other_key(pretrained: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(pretrained, weights_only=False)
    del checkpoint["state_dict"]["model.layers.0.attn.q_proj.weight"]
    checkpoint["state_dict"]["model.layers.0.extra"] = torch.zeros(1)
    torch.save(checkpoint, tmp_path / "broken.ckpt")
    sft = LlamaLM(init_checkpoint=str(tmp_path / "broken.ckpt"), norm_args={"lambda_final": 3.0})
    with pytest.raises(RuntimeError, match=r"missing keys \['layers.0.attn.q_proj.weight'\], unexpected keys "):
        sft.configure_model()
    rms = write_checkpoint(Llama(LlamaConfig.from_name("tiny", **TINY_OVERRIDES)), tmp_path / "rms.ckpt")
    with pytest.raises(ValueError, match=r"norm_args \['lambda_final'\] are not arguments of the checkpoint's norm"):
        LlamaLM(init_checkpoint=str(rms), norm_args={"lambda_final": 3.0})


def test_sft_recipe_with_the_bhyt_overlay(pretrained: Path) -> None:
    from bhyt_pl.cli import main

    args = [
        "--config", str(ROOT / "recipes/sft/lima-1b.yaml"), "--config", str(ROOT / "recipes/sft/norms/bhyt.yaml"),
        "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
        "--trainer.precision", "32-true", "--model.init_checkpoint", str(pretrained),
        "--data.init_args.data_files", str(ROOT / "tests/data/fixtures/lima_tiny.jsonl"),
        "--data.init_args.tokenizer", "embedded", "--data.init_args.max_seq_len", "56",
    ]  # fmt: skip
    cli = main(args, run=False)
    cli.model.configure_model()
    assert cli.model.config.norm_args["lambda_final"] == 3.0
    assert float(cli.model.model.final_norm.lambda_.detach()) == 3.0
    assert_model_uses_T(cli.model.model, 56)  # LIMA's max_seq_len, not the pretraining 32


@pytest.mark.slow  # trains a small study
def test_study_binds_its_sequence_length_and_a_new_fact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokens_per_step: None
) -> None:
    """The study's runs get BHyT's T and ``tokens_per_step``, a fact declared by this test's fixture alone
    (from the study's --seq-len and --batch-size)."""
    from bhyt_pl.study import main
    from bhyt_pl.study.run import runner

    built: list[LlamaLM] = []

    def recording(*args, **kwargs):
        built.append(runner_cls(*args, **kwargs))
        return built[-1]

    runner_cls = runner.LlamaLM
    monkeypatch.setattr(runner, "LlamaLM", recording)
    tiny = ["--quick", "--layers", "2", "--steps", "1", "--seq-len", "24", "--batch-size", "2", "--val-batches", "4",
            "--seeds", "1", "--lrs", "3e-3", "--no-importance"]  # fmt: skip
    schemes = ["--schemes", "bhyt", "tokens_probe"]
    argv = [*tiny, "--shuffle-buffer", "4", "--workers", "1", "--no-compile", *schemes]  # in-process: patched
    assert main([*argv, "--out", str(tmp_path / "study")]) == 0
    by_norm: dict[str, list[LlamaLM]] = {}
    for lm in built:  # selection and evaluation runs of both groups
        by_norm.setdefault(lm.config.norm, []).append(lm)
    assert set(by_norm) == {"bhyt", "tokens_probe"}
    for lm in by_norm["bhyt"]:
        assert lm.config.norm_args["seq_len"] == 24
        assert_model_uses_T(lm.model, 24)
    assert all(lm.config.norm_scheme().tokens_per_step == 24 * 2 for lm in by_norm["tokens_probe"])


def test_bench_binds_its_sequence_length_and_a_new_fact() -> None:
    from bhyt_pl.bench.models import build_model
    from bhyt_pl.bench.sites import block_norms
    from bhyt_pl.variants import parse_variant

    variant = parse_variant("bhyt:lambda_attn=1.0")
    model = build_model("tiny", variant, {"n_layers": 2}, torch.device("cpu"), torch.float32, seq_len=40)
    assert model.config.norm_args["seq_len"] == 40
    assert_model_uses_T(model, 40)
    assert block_norms(variant, 64, 4, torch.device("cpu"), torch.float32, seq_len=40).seq_len == 40
    probe = build_model(
        "tiny", parse_variant("batch_probe"), {"n_layers": 2}, torch.device("cpu"), torch.float32, 40, 6
    )
    assert probe.config.norm_scheme().batch_size == 6


def test_gpu_distributed_check_binds_its_sequence_length_and_a_new_fact() -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts/gpu_distributed_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = SimpleNamespace(preset="tiny", seq_len=80, batch=5)
    assert script.model_config(args, "bhyt").norm_args == {"seq_len": 80}
    assert script.model_config(args, "rmsnorm").norm_args == {}
    assert script.model_config(args, "batch_probe").norm_args == {"batch_size": 5}


# ----------------------------------------------------------------------------- checkpoint schema
def test_checkpoints_carry_a_schema_version_and_older_ones_still_load(pretrained: Path, tmp_path: Path) -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, tokenizer="embedded")
    saved: dict = {}
    lm.on_save_checkpoint(saved)
    assert saved["bhyt_pl"]["schema_version"] == SCHEMA_VERSION == 2
    assert saved["bhyt_pl"]["model_config"]["norm_args"] == {"seq_len": 32}

    # the format written before this version: no schema_version key, T in norm_args
    source = load_model(pretrained)
    old = write_checkpoint(source.model, tmp_path / "old.ckpt", schema_version=None)
    assert "schema_version" not in torch.load(old, weights_only=False)["bhyt_pl"]
    loaded = load_model(old)
    assert loaded.config == source.config and loaded.tokenizer == "embedded"
    assert_model_uses_T(loaded.model, 32)
    idx = torch.randint(0, TINY_OVERRIDES["vocab_size"], (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(idx), source.model(idx))
    sft = LlamaLM(init_checkpoint=str(old), norm_args={"lambda_final": 3.0}, seq_len=48)
    sft.configure_model()
    assert_model_uses_T(sft.model, 48)

    future = write_checkpoint(source.model, tmp_path / "future.ckpt", schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(ValueError, match=rf"schema_version {SCHEMA_VERSION + 1}; this bhyt_pl reads versions 1 to"):
        load_model(future)
