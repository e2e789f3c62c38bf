"""The Llama model: Hugging Face parity, KV cache, generation, compile, QK-norm, scheme-specific state dicts.

The checks every norm scheme passes (float64 reference, KV cache, meta-device init, state dict, bf16 autocast,
...) are ``tests/scheme_checks.py``'s, run over the registry by ``tests/norms/test_schemes.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.model import Block, rope_cos_sin
from bhyt_pl.norms import build_norm_scheme, registered_norms

SCHEMES = registered_norms()  # every built-in scheme (collected before any test registers its own)


def _small(norm: str = "rmsnorm", **kw) -> LlamaConfig:
    base = dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48, max_seq_len=64, norm=norm)
    return LlamaConfig.from_name("tiny", **{**base, **kw})


def test_parity_with_transformers_llama() -> None:
    transformers = pytest.importorskip("transformers")
    config = LlamaConfig.from_name("tiny", vocab_size=300, n_layers=3, max_seq_len=128)
    ours = Llama(config).eval()
    with torch.no_grad():  # non-trivial norm gains
        for layer in ours.layers:
            layer.norms.attn_in.weight.uniform_(0.5, 1.5)
            layer.norms.mlp_in.weight.uniform_(0.5, 1.5)
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=300,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            max_position_embeddings=128,
            attention_bias=False,
            mlp_bias=False,
        )
    ).eval()
    # copy weights by hand (independent of bhyt_pl.convert)
    sd = {"model.embed_tokens.weight": ours.embed.weight, "model.norm.weight": ours.final_norm.weight}
    for i, layer in enumerate(ours.layers):
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[f"model.layers.{i}.self_attn.{n}.weight"] = getattr(layer.attn, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            sd[f"model.layers.{i}.mlp.{n}.weight"] = getattr(layer.mlp, n).weight
        sd[f"model.layers.{i}.input_layernorm.weight"] = layer.norms.attn_in.weight
        sd[f"model.layers.{i}.post_attention_layernorm.weight"] = layer.norms.mlp_in.weight
    missing, unexpected = hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    idx = torch.randint(0, 300, (2, 100))
    with torch.no_grad():
        a, b = ours(idx), hf(idx).logits
    err = (a - b).abs().max().item()
    assert err < 1e-4, err


def test_convert_helper_round_trip() -> None:
    pytest.importorskip("transformers")
    from bhyt_pl.convert import from_hf_llama, to_hf_llama

    model = Llama(_small()).eval()
    idx = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), to_hf_llama(model)(idx).logits, atol=1e-5, rtol=1e-5)
    back = from_hf_llama(to_hf_llama(model))
    with torch.no_grad():
        torch.testing.assert_close(back(idx), model(idx))
    with pytest.raises(ValueError, match="only norm='rmsnorm'"):
        to_hf_llama(Llama(_small("bhyt")))
    with pytest.raises(ValueError, match="qk_norm='head' does not map onto Hugging Face Llama"):
        to_hf_llama(Llama(_small(qk_norm=True)))


def test_from_hf_refuses_query_key_norms() -> None:
    """A Hugging Face model with q/k norms (Qwen3-style) is refused rather than converted without them."""
    transformers = pytest.importorskip("transformers")
    from bhyt_pl.convert import from_hf_llama, to_hf_llama

    hf = to_hf_llama(Llama(_small()))
    hf.model.layers[0].self_attn.q_norm = transformers.models.llama.modeling_llama.LlamaRMSNorm(8)
    with pytest.raises(ValueError, match=r"has query/key norms \(model.layers.0.self_attn.q_norm.weight"):
        from_hf_llama(hf)


def test_greedy_generate_equals_argmax_loop_and_stops_at_eos() -> None:
    model = Llama(_small("bhyt")).eval()
    prompt = torch.randint(0, 97, (2, 5))
    out = model.generate(prompt, max_new_tokens=8)
    assert out.shape == (2, 13) and torch.equal(out[:, :5], prompt)
    seq = prompt
    with torch.no_grad():
        for _ in range(8):  # uncached reference
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)
    eos = int(out[0, 7])  # the third generated token of row 0
    stopped = model.generate(prompt[:1], max_new_tokens=8, eos_id=eos)
    first = (stopped[0, 5:] == eos).nonzero()[0].item()
    assert stopped.shape[1] == 5 + first + 1 and stopped[0, -1] == eos


def test_generate_stops_at_any_of_several_eos_ids_and_at_a_stop_callback() -> None:
    model = Llama(_small("bhyt")).eval()
    prompt = torch.randint(0, 97, (2, 5))
    free = model.generate(prompt, max_new_tokens=8)
    a, b = int(free[0, 6]), int(free[1, 8])  # row 0's second and row 1's fourth new token
    out = model.generate(prompt, max_new_tokens=8, eos_id=[a, b])
    for row in range(2):  # each row stops at its first stop token, then repeats it until all stopped
        new = free[row, 5:].tolist()
        n = min(new.index(t) for t in (a, b) if t in new) + 1
        assert out[row, 5 : 5 + n].tolist() == new[:n] and set(out[row, 5 + n :].tolist()) <= {new[n - 1]}
    seen: list[int] = []
    cut = model.generate(prompt, max_new_tokens=8, stop=lambda tokens: seen.append(tokens.shape[1]) or len(seen) == 3)
    assert seen == [6, 7, 8] and torch.equal(cut, free[:, :8])


def test_sampling_is_reproducible_and_top_k_restricts() -> None:
    model = Llama(_small()).eval()
    prompt = torch.randint(0, 97, (1, 4))
    a = model.generate(prompt, 6, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 6, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    # top_k=1 sampling is greedy
    g = model.generate(prompt, 6)
    assert torch.equal(model.generate(prompt, 6, temperature=0.7, top_k=1), g)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        model.generate(prompt, 2, temperature=-1.0)


def test_sequence_longer_than_max_seq_len_is_refused() -> None:
    model = Llama(_small(max_seq_len=16))
    with pytest.raises(ValueError, match="exceeds max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_state_dict_names_and_shapes_of_reordered_hybridnorm_ssnorm_and_gpas() -> None:
    """The state-dict keys and shapes of reordered, HybridNorm (and HybridNorm*), SSNorm and GPAS, as their
    papers and OLMo-core name them (d=32, hd=8, H=4, K=2)."""

    def shapes(norm: str, **kw) -> dict[str, tuple[int, ...]]:
        sd = Llama(_small(norm, **kw)).state_dict()
        return {k: tuple(v.shape) for k, v in sd.items() if not k.endswith(("_proj.weight", "embed.weight"))}

    assert shapes("reordered", qk_norm="full") == {
        **{f"layers.{i}.norms.{s}_out.weight": (32,) for i in range(2) for s in ("attn", "mlp")},
        **{f"layers.{i}.attn.q_norm.weight": (32,) for i in range(2)},
        **{f"layers.{i}.attn.k_norm.weight": (16,) for i in range(2)},
        "final_norm.weight": (32,),
    }
    qkv = {f"layers.{i}.attn.{n}_norm.weight": (8,) for i in range(2) for n in "qkv"}
    assert shapes("hybridnorm") == {
        **qkv,
        **{f"layers.{i}.norms.attn_res.weight": (32,) for i in range(2)},
        "final_norm.weight": (32,),
    }
    assert shapes("hybridnorm", norm_args={"star": True}) == {
        **qkv,
        "layers.0.norms.attn_in.weight": (32,),
        "layers.0.norms.mlp_in.weight": (32,),
        "layers.1.norms.attn_res.weight": (32,),
        "final_norm.weight": (32,),
    }
    assert shapes("ssnorm") == {
        **{f"layers.{i}.norms.{s}_in.weight": (1,) for i in range(2) for s in ("attn", "mlp")},
        "final_norm.weight": (1,),
    }
    gpas = shapes("gpas")
    assert {k: v for k, v in gpas.items() if "gpas" in k} == {f"layers.{i}.norms.gpas_gate": (1,) for i in range(2)}
    model = Llama(_small("gpas"))
    assert all(float(layer.norms.gpas_gate.detach()) == 0.0 for layer in model.layers)
    from bhyt_pl.optim import parameter_groups

    no_decay = {id(p) for p in parameter_groups(model, 0.1)[1]["params"]}
    assert all(id(layer.norms.gpas_gate) in no_decay for layer in model.layers)


def test_ngpt_names_settings_and_weight_constraint() -> None:
    """nGPT: the state-dict names and inits of OLMo-core's NormalizedTransformer, untied embeddings, softmax
    scale sqrt(hd), unit-norm weights along d at init, after loading and after the post-step hook, and the
    chunked loss with s_z."""
    model = Llama(_small("ngpt"))
    sd = model.state_dict()
    d = 32
    expected = {
        "s_z": (97, 1 / d**0.5),
        **{f"layers.{i}.attn.sq": (32, 1 / d**0.5) for i in range(2)},
        **{f"layers.{i}.attn.sk": (16, 1 / d**0.5) for i in range(2)},
        **{f"layers.{i}.mlp.{n}": (48, 1.0) for i in range(2) for n in ("s_up", "s_gate")},
        **{f"layers.{i}.norms.{n}": (32, 1 / d**0.5) for i in range(2) for n in ("alpha_attn", "alpha_mlp")},
    }
    assert {k: v for k, v in sd.items() if v.ndim == 1}.keys() == expected.keys()
    for key, (width, init) in expected.items():
        torch.testing.assert_close(sd[key], torch.full((width,), init), msg=key)
    assert model.lm_head is not None and model.config.tie_embeddings is False
    assert isinstance(model.final_norm, torch.nn.Identity)
    assert model.layers[0].attn.softmax_scale == 8**0.5
    with pytest.raises(ValueError, match=r"norm 'ngpt' needs tie_embeddings=False \(got True\)"):
        _small("ngpt", tie_embeddings=True)
    with pytest.raises(ValueError, match=r"norm 'ngpt' sets its own attention norms"):
        _small("ngpt", qk_norm="head")

    def unit(m: Llama) -> bool:
        return all(torch.allclose(w.norm(dim=dim), torch.ones(()), atol=1e-5) for w, dim in m.width_matrices())

    assert unit(model)
    raw = {k: v * 3 if v.ndim == 2 else v for k, v in sd.items()}  # weights off the sphere
    fresh = Llama(_small("ngpt"))
    fresh.load_state_dict(raw)
    assert unit(fresh) and torch.allclose(fresh.layers[0].attn.o_proj.weight, model.layers[0].attn.o_proj.weight)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 97, (2, 12))
    labels = torch.cat([idx[:, 1:], torch.full((2, 1), -100)], dim=1)
    model(idx, labels=labels).loss.backward()
    optimizer.step()
    assert not unit(model)
    model.constrain_weights()  # LlamaLM.optimizer_step's hook
    assert unit(model)
    with torch.no_grad():  # the chunked loss applies the same logit scale as the logits
        model.s_z.mul_(torch.rand(97) + 0.5)
        plain = F.cross_entropy(model(idx)[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
        torch.testing.assert_close(model(idx, labels=labels).loss, plain)


def test_qk_norm_choices_and_schemes_that_own_attention_norms() -> None:
    """``true`` is ``"head"`` (older configs load); ``hybridnorm`` refuses any qk_norm; a bad value is named."""
    assert _small(qk_norm=True).qk_norm == "head" and _small(qk_norm=False).qk_norm_layout is None
    old = Llama(_small(qk_norm=True))
    Llama(_small(qk_norm="head")).load_state_dict(old.state_dict(), strict=True)
    with pytest.raises(ValueError, match=r"norm 'hybridnorm' sets its own attention norms; qk_norm must be false"):
        _small("hybridnorm", qk_norm="full")
    with pytest.raises(ValueError, match=r"qk_norm must be false, 'head', 'full' or true .*got 'rows'"):
        _small(qk_norm="rows")


@pytest.mark.parametrize(("qk_norm", "q_width", "k_width"), [("head", 8, 8), ("full", 32, 16)])
def test_qk_norm_gains_reach_the_output_and_full_spans_the_heads(qk_norm: str, q_width: int, k_width: int) -> None:
    """QK-norm's gains are over ``hd`` (``head``) or the whole projection ``H*hd``, ``K*hd`` (``full``, OLMo 2), and
    they reach the logits, so the per-scheme float64 checks of ``qk_norm`` cases see them; ``full``'s statistic
    spans the heads, ``head``'s does not."""
    model = Llama(_small(qk_norm=qk_norm)).double().eval()
    attn = model.layers[0].attn
    assert attn.q_norm.weight.shape == (q_width,) and attn.k_norm.weight.shape == (k_width,)
    idx = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        ours = model(idx)
        attn.k_norm.weight.mul_(2.0)
        assert not torch.allclose(model(idx), ours)
        u = torch.randn(1, 5, 32, dtype=torch.float64)
        cos, sin = torch.ones(5, 8, dtype=torch.float64), torch.zeros(5, 8, dtype=torch.float64)
        head0 = attn.qk(u, cos, sin)[1][:, 0]
        attn.k_proj.weight[8:].mul_(3.0)  # key head 1 only
        moved = not torch.allclose(attn.qk(u, cos, sin)[1][:, 0], head0)
    assert moved == (qk_norm == "full")


def test_default_attention_is_bit_identical_to_plain_sdpa() -> None:
    """The scheme-driven attention without QK-norm computes exactly the pre-interface formula."""
    from bhyt_pl.model import apply_rope

    attn = Llama(_small()).layers[0].attn
    x = torch.randn(2, 7, 32)
    cos, sin = rope_cos_sin(torch.arange(7), 8, 500000.0)
    q = apply_rope(attn.q_proj(x).view(2, 7, 4, 8).transpose(1, 2), cos, sin)
    k = apply_rope(attn.k_proj(x).view(2, 7, 2, 8).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(2, 7, 2, 8).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with torch.no_grad():
        assert torch.equal(attn(x, cos, sin), attn.o_proj(y.transpose(1, 2).reshape(2, 7, 32)))
    assert attn.softmax_scale == 1 / 8**0.5


def test_post_and_mix_ln_placement() -> None:
    """Post-LN: no pre-norm, a norm after both adds, no final norm; Mix-LN: Post-LN in floor(0.25 L) layers."""
    post = Llama(_small("post_ln", n_layers=4))
    assert isinstance(post.final_norm, torch.nn.Identity)
    for layer in post.layers:
        assert isinstance(layer.norms.attn_in, torch.nn.Identity) and isinstance(layer.norms.mlp_in, torch.nn.Identity)
        assert layer.norms.attn_res.weight.shape == layer.norms.mlp_res.weight.shape == (32,)
    mix = Llama(_small("mix_ln", n_layers=8))  # floor(0.25 * 8) = 2 Post-LN layers
    kinds = [isinstance(layer.norms.attn_in, torch.nn.Identity) for layer in mix.layers]
    assert kinds == [True, True] + [False] * 6
    assert all(isinstance(layer.norms.attn_res, torch.nn.Identity) for layer in mix.layers[2:])
    assert not isinstance(mix.final_norm, torch.nn.Identity)
    counts = [build_norm_scheme("mix_ln", alpha=a).post_ln_layers(n) for a, n in [(0.25, 3), (0.25, 16), (0.29, 100)]]
    assert counts == [0, 4, 29]  # 0.29 * 100 is 28.999999999999996 in floats
    with torch.no_grad():  # a Post-LN block's output is the RMSNorm of the residual stream: unit RMS per token
        y = post.layers[0](torch.randn(1, 5, 32) * 3, *rope_cos_sin(torch.arange(5), 8, 500000.0))
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(1, 5), atol=1e-4, rtol=1e-4)


def test_paper_preset_parameter_counts() -> None:
    expected = {"llama-374m": 374e6, "llama-1b": 1.24e9, "llama-3b": 3.2e9}
    for name, target in expected.items():
        with torch.device("meta"):
            model = Llama(LlamaConfig.from_name(name))
        n = sum(p.numel() for p in model.parameters())
        assert abs(n - target) / target < 0.01, (name, n)
        # hand count: tied embedding + per layer (q, k, v, o, 3 MLP matrices) + norm gains
        c = model.config
        hand = (
            c.vocab_size * c.dim
            + c.n_layers * (c.dim * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads) + 3 * c.dim * c.mlp_dim + 2 * c.dim)
            + c.dim
        )
        assert n == hand


def test_rope_matches_hand_rotation() -> None:
    cos, sin = rope_cos_sin(torch.arange(3), 4, 10000.0, torch.float64)
    # position 2, pair 1 (indices 1 and 3): angle 2 * 10000^(-2/4) = 0.02
    assert cos[2, 1].item() == pytest.approx(torch.cos(torch.tensor(0.02, dtype=torch.float64)).item())
    assert sin[2, 3].item() == pytest.approx(torch.sin(torch.tensor(0.02, dtype=torch.float64)).item())


@pytest.mark.slow
@pytest.mark.parametrize(("norms", "backend"), [(SCHEMES, "aot_eager"), (["bhyt"], "inductor")])
def test_compile_fullgraph(norms: list[str], backend: str) -> None:
    """torch.compile(block, fullgraph=True): graph capture and autograd for every scheme (aot_eager; the
    Post-LN block and QK-norm once each), and full inductor code generation for BHyT (about 15 s a scheme
    on this CPU, so only one)."""
    cases = [(n, False) for n in norms] + ([("post_ln", True), ("reordered", "full")] if backend == "aot_eager" else [])
    for norm, qk_norm in cases:
        torch._dynamo.reset()  # a fresh cache per scheme: more block types than dynamo's recompile limit
        settings = build_norm_scheme(norm).model_settings  # nGPT: untied embeddings
        shape = dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, mlp_dim=24, vocab_size=8)
        config = LlamaConfig(**shape, norm=norm, qk_norm=qk_norm, **settings)
        block = Block(config, 0, config.norm_scheme())
        block.refresh_norm_constants()
        x = torch.randn(1, 6, 16, requires_grad=True)
        cos, sin = rope_cos_sin(torch.arange(6), config.head_dim, config.rope_theta)
        compiled = torch.compile(block, fullgraph=True, backend=backend)
        out = compiled(x, cos, sin)
        torch.testing.assert_close(out, block(x, cos, sin), atol=1e-5, rtol=1e-5)
        (grad,) = torch.autograd.grad(out.square().sum(), [x])
        (ref,) = torch.autograd.grad(block(x, cos, sin).square().sum(), [x])
        torch.testing.assert_close(grad, ref, atol=1e-5, rtol=1e-5)


def test_static_cache_with_tensor_positions_matches_full_forward() -> None:
    """The fixed-shape path of compiled decoding, run eager: tensor positions, the whole buffer read
    through a mask (a prefill chunk, a chunk after a prefix, then single tokens)."""
    model = Llama(_small("bhyt")).eval()
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_kv_cache(2, 32)
        pieces = [model(idx[:, :8], cache, torch.tensor(0)), model(idx[:, 8:12], cache, torch.tensor(8))]
        for t in range(12, 20):
            pieces.append(model(idx[:, t : t + 1], cache, torch.tensor(t)))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert [model.static_cache_len(n) for n in (1, 64, 65, 100)] == [64, 64, 64, 64]  # max_seq_len 64
    assert Llama(_small(max_seq_len=1024)).static_cache_len(129) == 256


@pytest.mark.slow
def test_compiled_generate_equals_eager_without_recompiling() -> None:
    """generate(compile=True): one graph for every decode position and for a second call with another
    prompt length in the same cache bucket (dynamo's counters), and the same greedy tokens as eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = Llama(_small("bhyt", n_layers=1)).eval()
    prompt = torch.randint(0, 97, (2, 5))
    counters.clear()
    out = model.generate(prompt, max_new_tokens=12, compile=True)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"]
    assert counters["stats"]["calls_captured"] > 0 and not counters["graph_break"]
    assert torch.equal(out, model.generate(prompt, max_new_tokens=12))
    longer = model.generate(prompt[:, :3], max_new_tokens=20, compile=True)  # 23 tokens: the same 64 bucket
    assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"]
    assert torch.equal(longer, model.generate(prompt[:, :3], max_new_tokens=20))


def test_ngpt_load_keeps_unit_weights_bit_identical_and_normalises_others() -> None:
    """Resuming nGPT is exact: a state dict saved after a constrained step loads bit for bit (renormalising
    unit rows would move many elements by an ulp), while rows off the sphere are still normalised."""
    torch.manual_seed(0)
    model = Llama(_small("ngpt"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 97, (2, 12))
    model(idx, labels=idx).loss.backward()
    optimizer.step()
    model.constrain_weights()  # LlamaLM.optimizer_step's hook
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    renormalised = Llama(_small("ngpt"))
    renormalised.load_state_dict(saved)
    renormalised.constrain_weights()  # what loading did before: some elements move by an ulp
    assert any(not torch.equal(v, saved[k]) for k, v in renormalised.state_dict().items())
    fresh = Llama(_small("ngpt"))
    fresh.load_state_dict(saved)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, saved[key]), key
    off = dict(saved)
    off["layers.0.attn.q_proj.weight"] = saved["layers.0.attn.q_proj.weight"].clone()
    off["layers.0.attn.q_proj.weight"][3] *= 1.01  # one row off the sphere
    off["layers.0.attn.o_proj.weight"] = saved["layers.0.attn.o_proj.weight"] * 2  # every column
    fresh.load_state_dict(off)
    q, o = fresh.layers[0].attn.q_proj.weight, fresh.layers[0].attn.o_proj.weight
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(q.shape[0]))
    torch.testing.assert_close(o.norm(dim=0), torch.ones(o.shape[1]))
    assert torch.equal(q[:3], saved["layers.0.attn.q_proj.weight"][:3])  # unit rows untouched
