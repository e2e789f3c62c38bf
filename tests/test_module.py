"""LlamaLM: loss, FLOPs, optimisation, subclassing, checkpoints."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import ModelCheckpoint
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl import Llama, LlamaConfig, LlamaLM, load_model
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.optim import cosine_with_warmup


def test_analytic_flops_match_measure_flops_on_meta() -> None:
    for preset, overrides in [("tiny", {}), ("llama-374m", {"n_layers": 2})]:
        # reference norm sites: the fused RMSNorm's backward reduces with matrix-vector products that the
        # FLOP counter counts as ``mm``; norm work is outside the MFU convention the formula follows
        config = LlamaConfig.from_name(preset, norm_args={"impl": "reference"}, **overrides)
        B, T = 2, 128
        with torch.device("meta"):
            model = Llama(config)
            idx = torch.zeros(B, T, dtype=torch.long)
        measured = measure_flops(model, lambda: model(idx), loss_fn=lambda y: y.sum())
        assert B * T * training_flops_per_token(config, T) == pytest.approx(measured, rel=1e-9)


def test_expected_flops_per_batch_needs_the_runs_seq_len() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, seq_len=32)
    assert lm.expected_flops_per_batch(4) == 4 * 32 * training_flops_per_token(lm.config, 32)
    assert LlamaLM(overrides=TINY_OVERRIDES).expected_flops_per_batch(4) is None  # no seq_len: no FLOP count
    from types import SimpleNamespace

    from bhyt_pl.callbacks.summary import training_flops_per_batch

    trainer = SimpleNamespace(datamodule=SimpleNamespace(batch_size=4))  # the summary then shows no FLOPs
    assert training_flops_per_batch(trainer, LlamaLM(overrides=TINY_OVERRIDES)) is None
    assert training_flops_per_batch(trainer, lm) == 4 * 32 * training_flops_per_token(lm.config, 32)


def test_loss_is_shifted_cross_entropy_with_ignore_index() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES)
    lm.configure_model()
    ids = torch.randint(0, 64, (2, 9))
    labels = ids.roll(-1, dims=1)
    labels[:, :3] = -100  # a masked prompt
    assert lm.model.loss_impl == "auto"  # the chunked loss, inside the model's forward
    loss, n = lm.compute_loss({"input_ids": ids, "labels": labels})
    logits = lm.model(ids)
    kept = labels != -100
    expected = -torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0][kept].mean()
    torch.testing.assert_close(loss, expected)
    assert n == kept.sum()


def test_predict_step_sums_per_token_nll_of_each_sequence() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, loss_chunk_tokens=5)  # several chunks over 2 x 9 tokens
    lm.configure_model()
    ids = torch.randint(0, 64, (2, 9))
    labels = ids.roll(-1, dims=1)
    labels[0, :4] = -100
    with torch.no_grad():
        out = lm.predict_step({"input_ids": ids, "labels": labels}, 0)
        logp = torch.log_softmax(lm.model(ids).double(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    expected = -(logp * (labels != -100)).sum(dim=1)
    torch.testing.assert_close(out["nll"].double(), expected, rtol=1e-5, atol=1e-5)
    assert out["tokens"].tolist() == [5, 9]


def test_cosine_schedule_hand_values() -> None:
    assert cosine_with_warmup(0, 10, 110, 0.1) == pytest.approx(0.1)
    assert cosine_with_warmup(9, 10, 110, 0.1) == pytest.approx(1.0)
    assert cosine_with_warmup(10, 10, 110, 0.1) == pytest.approx(1.0)
    assert cosine_with_warmup(60, 10, 110, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos = 0
    assert cosine_with_warmup(110, 10, 110, 0.1) == pytest.approx(0.1)
    assert cosine_with_warmup(500, 10, 110, 0.1) == pytest.approx(0.1)


def test_optimizer_groups_schedule_and_no_decay_on_norms() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="dyt", lr=1e-2, warmup_steps=2, min_lr_ratio=0.0, weight_decay=0.3)
    trainer = quiet_trainer(max_steps=4)
    trainer.fit(lm, TokenDataModule())
    opt = trainer.optimizers[0]
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.3 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in lm.model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} >= {"emb_norm.scale", "layers.0.norms.attn_in.alpha"}
    assert opt.defaults["betas"] == (0.9, 0.95)
    # after 4 steps with warmup 2 and total 4: multiplier cos(pi * 2/2) -> 0
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * cosine_with_warmup(4, 2, 4, 0.0))


def test_ngpt_recipe_and_post_step_weight_constraint(caplog) -> None:
    """nGPT declares no weight decay and no warmup (OLMo-core's recipe): applied unless given, logged; fit
    renormalises every matrix along d after each optimizer step."""
    import logging

    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="ngpt", lr=1e-2)
    assert (lm.hparams.weight_decay, lm.hparams.warmup_steps) == (0.0, 0)
    mine = LlamaLM(overrides=TINY_OVERRIDES, norm="ngpt", weight_decay=0.05, warmup_steps=3)
    assert (mine.hparams.weight_decay, mine.hparams.warmup_steps) == (0.05, 3)
    ratio = LlamaLM(overrides=TINY_OVERRIDES, norm="ngpt", warmup_ratio=0.2)  # the recipe's warmup_steps=0 would win
    assert (ratio.hparams.weight_decay, ratio.hparams.warmup_ratio, ratio.hparams.warmup_steps) == (0.0, 0.2, None)
    plain = LlamaLM(overrides=TINY_OVERRIDES)
    assert (plain.hparams.weight_decay, plain.hparams.warmup_ratio, plain.hparams.warmup_steps) == (0.1, 0.05, None)
    trainer = quiet_trainer(max_steps=2)
    with caplog.at_level(logging.INFO):
        trainer.fit(lm, TokenDataModule())
    # one line at the fit: each setting, and where it came from
    expected = ("LlamaLM: training settings weight_decay=0.0 (norm ngpt), warmup_ratio=0.05 (LlamaLM default; "
                "warmup_steps wins), warmup_steps=0 (norm ngpt)")  # fmt: skip
    assert [r.getMessage() for r in caplog.records if "training settings" in r.getMessage()] == [expected]
    assert trainer.optimizers[0].param_groups[0]["weight_decay"] == 0.0
    for w, dim in lm.model.width_matrices():
        torch.testing.assert_close(w.detach().norm(dim=dim), torch.ones(w.shape[dim - 1]))


def test_subclass_with_auxiliary_loss_trains() -> None:
    class ZLossLM(LlamaLM):
        """PaLM's z-loss on top of cross-entropy, in a few lines."""

        def compute_loss(self, batch):
            logits = self(batch["input_ids"])
            ce = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            z = torch.logsumexp(logits.float(), -1).pow(2).mean()
            self.log("train/z_loss", z)
            return ce + 1e-4 * z, (batch["labels"] != -100).sum()

    lm = ZLossLM(overrides=TINY_OVERRIDES, norm="bhyt", lr=1e-2, warmup_steps=0)
    trainer = quiet_trainer(max_steps=12, limit_val_batches=2, val_check_interval=12)
    data = TokenDataModule()
    before = trainer.validate(lm, data, verbose=False)[0]["val/loss"]  # builds the model, T from the data module
    trainer = quiet_trainer(max_steps=12)
    trainer.fit(lm, data)
    assert "train/z_loss" in trainer.callback_metrics
    after = quiet_trainer().validate(lm, data, verbose=False)[0]["val/loss"]
    assert after < before - 0.5


def test_checkpoint_loads_back_with_one_call(tmp_path) -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", norm_args={"lambda_attn": 1.5}, tokenizer="embedded")
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True, callbacks=[ckpt], default_root_dir=tmp_path)
    trainer.fit(lm, TokenDataModule())
    loaded = load_model(tmp_path / "last.ckpt")
    assert loaded.config == lm.config and loaded.tokenizer == "embedded"
    assert loaded.config.norm_args == {"lambda_attn": 1.5, "seq_len": 32}  # T bound from the data module
    idx = torch.randint(0, 64, (1, 16))
    lm.model.refresh_norm_constants()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(idx), lm.model.eval()(idx))
    for a, b in zip(loaded.model.layers, lm.model.layers):
        assert float(a.norms.c) == pytest.approx(float(b.norms.c))
    # fine-tuning from it takes the architecture from the checkpoint
    sft = LlamaLM(preset="llama-1b", init_checkpoint=str(tmp_path / "last.ckpt"), overrides={"max_seq_len": 128})
    assert sft.config.norm == "bhyt" and sft.config.dim == 32 and sft.config.max_seq_len == 128
    sft.configure_model()
    torch.testing.assert_close(sft.model.embed.weight, lm.model.embed.weight)


def test_mix_ln_with_qk_norm_checkpoint_round_trip(tmp_path) -> None:
    """The post-residual sites and the q/k gains survive a Lightning checkpoint and load in one call."""
    overrides = {**TINY_OVERRIDES, "qk_norm": True}
    lm = LlamaLM(overrides=overrides, norm="mix_ln", norm_args={"alpha": 0.5}, tokenizer="embedded")
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True, callbacks=[ckpt], default_root_dir=tmp_path)
    trainer.fit(lm, TokenDataModule())
    loaded = load_model(tmp_path / "last.ckpt")
    assert loaded.config == lm.config and loaded.config.qk_norm
    keys = set(loaded.model.state_dict())
    assert {"layers.0.norms.attn_res.weight", "layers.0.attn.q_norm.weight", "layers.1.attn.k_norm.weight"} <= keys
    idx = torch.randint(0, 64, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(idx), lm.model.eval()(idx))


def test_seq_len_sets_bhyt_T_unless_given() -> None:
    assert LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=48).config.norm_args["seq_len"] == 48
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", norm_args={"seq_len": 16}, seq_len=48)
    assert lm.config.norm_args["seq_len"] == 16
    assert "seq_len" not in LlamaLM(overrides=TINY_OVERRIDES, norm="dyt", seq_len=48).config.norm_args
    assert lm.hparams["norm"] == "bhyt" and lm.hparams["norm_args"]["seq_len"] == 16


def test_bad_arguments_fail_at_construction() -> None:
    with pytest.raises(ValueError, match=r"(?s)lr must be > 0.*min_lr_ratio must be in \[0, 1\]"):
        LlamaLM(lr=-1.0, min_lr_ratio=2.0)
    with pytest.raises(ValueError, match="unknown norm 'bhytt'"):
        LlamaLM(norm="bhytt")
    with pytest.raises(ValueError, match="seq_len=4096 exceeds the model's max_seq_len=512"):
        LlamaLM(seq_len=4096)
    with pytest.raises(ValueError, match="unknown model preset"):
        LlamaLM(preset="gpt2")
    with pytest.raises(ValueError, match=r"(?s)loss_impl must be one of auto, chunked.*loss_chunk_tokens must be >= 1"):
        LlamaLM(loss_impl="fused", loss_chunk_tokens=0)


def test_perplexity_is_exp_of_token_weighted_val_loss() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES)
    data = TokenDataModule()
    lm.configure_model()
    metrics = quiet_trainer().validate(lm, data, verbose=False)[0]
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in data.val_dataloader():
            loss, n = lm.compute_loss(batch)
            total, count = total + loss.item() * n.item(), count + n.item()
    assert metrics["val/loss"] == pytest.approx(total / count, rel=1e-5)
    assert metrics["val/perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


def _one_step_losses(lm: LlamaLM, steps: int = 2) -> list[float]:
    data = TokenDataModule()
    losses = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    quiet_trainer(max_steps=steps, callbacks=[Record()]).fit(lm, data)
    return losses


def test_activation_checkpointing_gives_the_same_training() -> None:
    torch.manual_seed(0)
    plain = _one_step_losses(LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", warmup_steps=0))
    torch.manual_seed(0)
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", warmup_steps=0, activation_checkpointing=True)
    assert _one_step_losses(lm) == pytest.approx(plain, abs=1e-6)
    assert lm.model.activation_checkpointing


@pytest.mark.slow
def test_compile_option_compiles_each_block_and_trains_like_eager() -> None:
    """``compile=True`` (each block in place, before any sharding): same losses as eager, same keys."""
    torch.manual_seed(0)
    eager = _one_step_losses(LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", warmup_steps=0))
    torch.manual_seed(0)
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", warmup_steps=0, compile=True)
    compiled = _one_step_losses(lm)
    assert compiled == pytest.approx(eager, abs=1e-4)
    assert all(layer._compiled_call_impl is not None for layer in lm.model.layers)
    assert not any("_orig_mod" in k for k in lm.state_dict())


# ----------------------------------------------------------------------------- plain Lightning, no CLI
class _Subclass(LlamaLM):
    """A user's subclass (the path the model card promises), trained with a plain ``Trainer`` and its default
    logger, which merges the module's and the data module's hyperparameters."""


def test_plain_lightning_takes_the_run_facts_from_the_data_module(tmp_path) -> None:
    """It raised "Error while merging hparams: the keys ['seq_len', 'tokenizer'] ... have different values" (None
    against 32), after warning that BHyT had no seq_len; hiding that error would have left T at 1024."""
    from lightning.pytorch.core.saving import load_hparams_from_yaml

    from bhyt_pl.data import C4DataModule
    from bhyt_pl.norms.bhyt import UNBOUND_SEQ_LEN

    model = _Subclass(preset="tiny", norm="bhyt", overrides={"n_layers": 1})
    data = C4DataModule(data_files="embedded", tokenizer="embedded", seq_len=32, batch_size=2)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", limit_val_batches=1, default_root_dir=tmp_path,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, data)
    assert UNBOUND_SEQ_LEN != 32
    assert model.config.norm_args["seq_len"] == 32 and all(layer.norms.seq_len == 32 for layer in model.model.layers)
    assert (model.hparams.seq_len, model.hparams.tokenizer) == (32, "embedded")
    assert model.hparams.run_facts == {"seq_len": 32, "batch_size": 2}
    logged = load_hparams_from_yaml(tmp_path / "lightning_logs" / "version_0" / "hparams.yaml")
    assert logged["norm_args"] == {"seq_len": 32} and logged["seq_len"] == 32
    (path,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    assert checkpoint["bhyt_pl"]["model_config"]["norm_args"]["seq_len"] == 32  # the checkpoint carries T
    assert checkpoint["hyper_parameters"]["seq_len"] == 32 and load_model(path).tokenizer == "embedded"
    assert "val/loss" in trainer.callback_metrics  # a 2-step run validated at its last step


def test_a_seq_len_or_tokenizer_that_differs_from_the_data_modules_is_one_error() -> None:
    for kwargs, message in (
        ({"seq_len": 48}, "LlamaLM has seq_len=48, the data module seq_len=32"),
        ({"tokenizer": "meta-llama/Llama-3.2-1B"},
         "LlamaLM has tokenizer='meta-llama/Llama-3.2-1B', the data module tokenizer='embedded'"),
    ):  # fmt: skip
        model = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", **kwargs)
        with pytest.raises(ValueError, match=message) as err:
            quiet_trainer(max_steps=1).fit(model, TokenDataModule(seq_len=32))
        assert "\n" not in str(err.value) and "leave them unset" in str(err.value)
        assert model.model is None  # before any work
    agreeing = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, tokenizer="embedded")
    quiet_trainer(max_steps=1).fit(agreeing, TokenDataModule(seq_len=32))
    assert agreeing.config.norm_args["seq_len"] == 32


def test_a_model_built_before_it_knew_the_facts_refuses_a_data_module_that_changes_it() -> None:
    """Built unbound (T = 1024, with a warning), it would have trained on 32-token windows with the wrong T."""
    model = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt")
    with pytest.warns(UserWarning, match=r"needs the run fact\(s\) \['seq_len'\].* falls back to seq_len=1024"):
        model.configure_model()
    built = r"built before it knew this run's facts .* from \{'seq_len': 1024\} to \{'seq_len': 32\}"
    with pytest.raises(ValueError, match=built):
        quiet_trainer(max_steps=1).fit(model, TokenDataModule(seq_len=32))
    plain = LlamaLM(overrides=TINY_OVERRIDES)  # rmsnorm declares no fact: nothing changes, nothing to refuse
    plain.configure_model()
    quiet_trainer(max_steps=1).fit(plain, TokenDataModule(seq_len=32))
    assert plain.hparams.seq_len == 32


def test_plain_loaders_bind_nothing_and_bind_run_facts_binds_by_hand() -> None:
    data = TokenDataModule(seq_len=32)
    model = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt")
    model.bind_run_facts(data.run_facts(), "embedded")
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, data.train_dataloader())
    assert model.config.norm_args["seq_len"] == 32 and model.hparams.tokenizer == "embedded"


def test_subclasses_with_their_own_training_step_and_optimizer_train_in_plain_lightning() -> None:
    """The two subclasses of docs/tutorials/own-project.md in small: a training step of one's own (its extra term
    logged, validation unchanged) and an optimizer and schedule of one's own (used as returned, norm parameters
    still undecayed)."""
    from bhyt_pl.optim import parameter_groups

    class ZLossLM(LlamaLM):
        def training_step(self, batch, batch_idx):
            logits = self(batch["input_ids"])
            ce = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            z_loss = torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
            self.log_dict({"train/loss": ce, "train/z_loss": z_loss})
            return ce + 1e-4 * z_loss

    class OneCycleLM(LlamaLM):
        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(parameter_groups(self.model, self.hparams.weight_decay), lr=self.hparams.lr)
            total = int(self.trainer.estimated_stepping_batches)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr, total_steps=total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    z = ZLossLM(overrides=TINY_OVERRIDES, norm="bhyt", lr=1e-2)
    trainer = quiet_trainer(max_steps=4, limit_val_batches=1)
    trainer.fit(z, TokenDataModule())
    assert {"train/z_loss", "train/loss", "val/loss"} <= set(trainer.callback_metrics)
    assert z.config.norm_args["seq_len"] == 32  # T from the data module, as for LlamaLM itself
    one_cycle = OneCycleLM(overrides=TINY_OVERRIDES, norm="dyt", lr=1e-2)
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0)
    trainer.fit(one_cycle, TokenDataModule())
    (scheduler,) = trainer.lr_scheduler_configs
    assert isinstance(scheduler.scheduler, torch.optim.lr_scheduler.OneCycleLR) and scheduler.scheduler.total_steps == 4
    decay, no_decay = trainer.optimizers[0].param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    alphas = [p for p in no_decay["params"] if p.numel() == 1]  # DyT's alpha per site
    assert all(p.ndim < 2 for p in no_decay["params"]) and alphas
