"""Folded rules that a norm could cancel (issue 37, item 7), measured in the forward pass itself.

The depth rule's branch multiplier β and µP's attention scale are folded into weights (models/depth.py,
handoff/fold.py). A norm placed after the weight the multiplier was folded into removes it: OLMo2 and
Gemma2/3 normalise each branch's output after o_proj/down_proj (post_attention_layernorm,
post_feedforward_layernorm), and Qwen3/OLMo2/Gemma3 normalise the queries after q_proj (q_norm). So
these tests look at what the forward pass does, not at the folded weight:

- the residual update of each branch, h_mid − h_l (attention) and h_{l+1} − h_mid (MLP), of a
  completep / depth-mup model at depth 4 over base depth 2 against the same model under `none`, each
  branch fed the same input in both models: the ratio is β (0.5, 2^−½) within rel 1e-4, or the build
  is refused with the reason (Gemma2/3, whose norm gain enters as 1 + weight);
- the attention logits scale·q·kᵀ as the attention kernel receives them (a registered attention
  function that records its inputs), of the plain model `fold` returns against the µP model it was
  folded from: equal, so the logit scale is µP's √d_base / d, or the fold is refused (Gemma3).
"""

from __future__ import annotations

import math

import pytest
import torch

from hptransfer.hyperparameters import Hyperparameters
from hptransfer.models import build_model, build_optimizer, lm_logits
from hptransfer.models.build import lm_loss
from hptransfer.models.depth import depth_scaling, param_factors, rescale_optimizer
from hptransfer.spec import ModelSpec

HPS = Hyperparameters(lr=0.02, weight_decay=0.1, output_mult=2.0)
# Forward-pass checks at init_std 1: activations of order 1, as after training. At the default 0.02 a
# block without a pre-norm (OLMo2) has branch outputs whose mean square is below the RMSNorm's ε, where
# the norm is nearly linear and hides that it cancels a multiplier folded before it.
FORWARD_HPS = HPS.model_copy(update={"init_std": 1.0})
WIDTH, BASE_WIDTH = 32, 16
BETA = {"completep": 0.5, "depth-mup": 2**-0.5}  # depth 4 over base depth 2: β = 2^(−α), from the papers
REL = 1e-4  # float64 models; the norms compute in float32 inside

# Tiny configs: GQA group 2 where the family has grouped KV heads by default (head size 8 at width 32).
DEPTH_FAMILIES = {
    "llama": {"family": "llama"},
    "qwen3": {"family": "hf", "config": {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2}},
    "olmo2": {"family": "hf", "config": {"model_type": "olmo2", "num_attention_heads": 4, "num_key_value_heads": 4}},
}
REFUSED_DEPTH = {
    "Gemma2": {"family": "hf", "config": {"model_type": "gemma2", "num_attention_heads": 4, "num_key_value_heads": 2}},
    "Gemma3": {"family": "hf", "config": {"model_type": "gemma3_text", "num_attention_heads": 4, "num_key_value_heads": 2}},
}


def _depth_spec(model: dict, dp: str) -> ModelSpec:
    return ModelSpec(**model, depth=4, head_dim=8, seq_len=16, parametrization="mup", depth_parametrization=dp, base_depth=2)


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.model.layers


def _mlp_entry(layer: torch.nn.Module) -> torch.nn.Module:
    """The first module of the MLP half of a decoder layer: its input is the residual stream after the
    attention branch was added (h_mid). Written per architecture here, not read from hptransfer."""
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma2/3: pre- and post-norm around each branch
        return layer.pre_feedforward_layernorm
    if hasattr(layer, "input_layernorm"):  # Llama, Qwen3: `post_attention_layernorm` is the MLP's pre-norm
        return layer.post_attention_layernorm
    return layer.mlp  # OLMo2: no pre-norm, the MLP reads h_mid itself


def _residual_stream(model: torch.nn.Module, x: torch.Tensor, feed: list[dict] | None = None) -> list[dict]:
    """Per decoder layer: its input `in`, the stream after the attention branch `mid`, its output `out`.
    With `feed` (another model's record), each layer's input and its MLP half's input are replaced by
    the record's, so every branch of both models sees the same input."""
    rec: list[dict] = []
    handles = []

    def swap(args, kwargs, new):
        if args:
            return (new, *args[1:]), kwargs
        key = next(iter(kwargs))
        return args, {**kwargs, key: new}

    for i, layer in enumerate(_layers(model)):
        r: dict = {}
        rec.append(r)

        def on_in(_m, args, kwargs, i=i, r=r):
            h = args[0] if args else next(iter(kwargs.values()))
            r["in"] = h if feed is None else feed[i]["in"]
            return None if feed is None else swap(args, kwargs, feed[i]["in"])

        def on_mid(_m, args, kwargs, i=i, r=r):
            r["mid"] = args[0] if args else next(iter(kwargs.values()))
            return None if feed is None else swap(args, kwargs, feed[i]["mid"])

        def on_out(_m, _args, _kwargs, out, r=r):
            r["out"] = out if isinstance(out, torch.Tensor) else out[0]

        handles += [
            layer.register_forward_pre_hook(on_in, with_kwargs=True),
            _mlp_entry(layer).register_forward_pre_hook(on_mid, with_kwargs=True),
            layer.register_forward_hook(on_out, with_kwargs=True),
        ]
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in handles:
            h.remove()
    return rec


def _branch_updates(rec: list[dict]) -> list[torch.Tensor]:
    """Each branch's update of the residual stream: attention h_mid − h_l, MLP h_{l+1} − h_mid."""
    return [u for r in rec for u in (r["mid"] - r["in"], r["out"] - r["mid"])]


def _ids(spec: ModelSpec) -> torch.Tensor:
    return torch.randint(0, spec.vocab, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dp", list(BETA))
@pytest.mark.parametrize("family", list(DEPTH_FAMILIES))
def test_the_branch_multiplier_scales_each_residual_update_by_beta(family, dp):
    """completep / depth-mup at depth 4 over base 2 against `none` (the same seed, the same weights
    before the fold): every branch's update of the residual stream is β times `none`'s. Before the
    fix OLMo2's post-branch RMSNorm gave a ratio of 1 (β folded into o_proj/down_proj, then
    normalised away)."""
    plain = build_model(_depth_spec(DEPTH_FAMILIES[family], "none"), WIDTH, base_width=BASE_WIDTH, hps=FORWARD_HPS, seed=0)
    scaled = build_model(_depth_spec(DEPTH_FAMILIES[family], dp), WIDTH, base_width=BASE_WIDTH, hps=FORWARD_HPS, seed=0)
    plain, scaled = plain.double(), scaled.double()
    x = _ids(_depth_spec(DEPTH_FAMILIES[family], dp))
    ref = _residual_stream(plain, x)
    got = _residual_stream(scaled, x, feed=ref)
    beta = BETA[dp]
    updates = list(zip(_branch_updates(got), _branch_updates(ref)))
    assert len(updates) == 2 * 4
    for k, (u, u0) in enumerate(updates):
        assert u0.norm() > 0, k
        ratio = (u.norm() / u0.norm()).item()
        assert ratio == pytest.approx(beta, rel=REL), (family, dp, k, ratio)
        assert ((u - beta * u0).norm() / (beta * u0).norm()).item() < REL, (family, dp, k)  # and along u0


@pytest.mark.parametrize("dp", list(BETA))
@pytest.mark.parametrize("name", list(REFUSED_DEPTH))
def test_a_post_branch_norm_whose_gain_is_one_plus_weight_refuses_the_depth_rule(name, dp):
    """Gemma2/3: RMSNorm(branch) · (1 + weight) after o_proj and down_proj. β on the projection is
    normalised away and β cannot be a per-parameter scale of a gain that enters as 1 + weight: refused,
    naming the family, the norm and what to use instead. At the ladder's depth (β = 1) and under `none`
    the model still builds."""
    with pytest.raises(NotImplementedError) as e:
        build_model(_depth_spec(REFUSED_DEPTH[name], dp), WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)
    msg = str(e.value)
    assert name in msg and "post_attention_layernorm" in msg and "post_feedforward_layernorm" in msg, msg
    assert "depth_parametrization: none" in msg, msg
    build_model(_depth_spec(REFUSED_DEPTH[name], "none"), WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)
    at_base = ModelSpec(
        **REFUSED_DEPTH[name], depth=2, head_dim=8, seq_len=16, parametrization="mup", depth_parametrization=dp, base_depth=2
    )
    build_model(at_base, WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)


def test_olmo2_depth_rule_trains_as_beta_after_its_post_branch_norms():
    """The fold's optimizer side for OLMo2: β on the post-branch norm gains with lr × β, wd / β, ε / β
    (build_optimizer) trains as the explicit multiplier β on those norms' outputs (hooks written here)
    with the hidden rule alone."""
    from hptransfer.data import load_corpus

    spec = _depth_spec(DEPTH_FAMILIES["olmo2"], "completep")
    s = depth_scaling(spec)
    folded = build_model(spec, WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)
    explicit = build_model(_depth_spec(DEPTH_FAMILIES["olmo2"], "none"), WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)
    for layer in _layers(explicit):
        for norm in (layer.post_attention_layernorm, layer.post_feedforward_layernorm):
            norm.register_forward_hook(lambda _m, _i, out, b=s.branch: out * b)
    hidden_only = dict.fromkeys(param_factors(explicit, s), (s.hidden_lr, 1.0, s.hidden_eps))
    opts = [build_optimizer(folded, "mup", HPS, depth=s), rescale_optimizer(build_optimizer(explicit, "mup", HPS), hidden_only)]
    corpus = load_corpus(0.1, 20)
    losses: list[list[float]] = [[], []]
    for step in range(5):
        x, y = corpus.batch("train", step, 8, 16)
        for model, opt, out in zip((folded, explicit), opts, losses):
            loss = lm_loss(lm_logits(model, x), y)
            out.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert max(abs(a - b) / b for a, b in zip(*losses)) < 1e-4, losses
    assert losses[0][-1] < losses[0][0] - 0.2  # it trains


# --- µP's attention scale through the fold ---------------------------------------------------------

ATTN_FAMILIES = {
    "qwen3": {"model_type": "qwen3", "num_attention_heads": 2, "num_key_value_heads": 1},  # q_norm per head
    "olmo2": {"model_type": "olmo2", "num_attention_heads": 2, "num_key_value_heads": 2},  # q_norm over all heads
    "llama": {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 1},  # no q_norm
    "gemma2": {"model_type": "gemma2", "num_attention_heads": 2, "num_key_value_heads": 1},  # no q_norm
}


def _attn_spec(config: dict) -> ModelSpec:
    # n_heads fixed: the head size grows 8 → 16 from base width 16 to width 32, so 1/d differs from 1/√d
    return ModelSpec(family="hf", config=config, depth=2, n_heads=2, attn_scale="1/d", seq_len=16, parametrization="mup")


def _fold(model: torch.nn.Module):
    from hptransfer.handoff.fold import fold

    opt = build_optimizer(model, "mup", HPS)
    unit = build_optimizer(model, "mup", HPS.model_copy(update={"weight_decay": 1.0}))
    wd = {id(p): g["weight_decay"] for g in unit.param_groups for p in g["params"]}
    return fold(model, opt, HPS.lr, wd)


_SEEN: list[tuple[float, torch.Tensor]] = []


def _probe(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """The attention kernel's inputs as it receives them: logits = scaling · q·kᵀ (KV heads repeated),
    before any soft-capping. Then the architecture's own eager attention (Gemma2's soft-caps)."""
    import sys

    k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    _SEEN.append((float(scaling), scaling * query.detach() @ k.detach().transpose(-1, -2)))
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def _attention_logits(model: torch.nn.Module, x: torch.Tensor) -> list[tuple[float, torch.Tensor]]:
    from transformers import AttentionInterface

    AttentionInterface.register("hpt_logit_probe", _probe)
    before = model.config._attn_implementation
    model.set_attn_implementation("hpt_logit_probe")
    _SEEN.clear()
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        model.set_attn_implementation(before)
    out = list(_SEEN)
    _SEEN.clear()
    return out


@pytest.mark.parametrize("family", list(ATTN_FAMILIES))
def test_the_folded_model_has_the_mup_attention_logits(family):
    """µP's attention scale √d_base/d, folded for a trainer that builds the architecture's default
    scale: the plain model's attention logits equal the µP model's, in every layer. Before the fix
    Qwen3's and OLMo2's q_norm normalised the factor folded into q_proj away (logits √2 too large)."""
    spec = _attn_spec(ATTN_FAMILIES[family])
    mup = build_model(spec, WIDTH, base_width=BASE_WIDTH, hps=FORWARD_HPS, seed=0)
    folded = _fold(mup)
    x = _ids(spec)
    want, got = _attention_logits(mup, x), _attention_logits(folded.model, x)
    assert len(want) == len(got) == 2
    d, d_base = WIDTH // 2, BASE_WIDTH // 2
    for (mup_scale, a), (plain_scale, b) in zip(want, got):
        assert mup_scale == pytest.approx(plain_scale * math.sqrt(d_base / d), rel=1e-12)  # the plain model keeps its default
        if family != "gemma2":  # Gemma2's default is query_pre_attn_scalar^−½, not 1/√d
            assert mup_scale == pytest.approx(math.sqrt(d_base) / d, rel=1e-12)
        assert ((b - a).norm() / a.norm()).item() < 1e-5, family
        measured = (b * a).sum() / (a * a).sum() * mup_scale  # the plain model's logit scale, per µP's q·kᵀ
        assert measured.item() == pytest.approx(mup_scale, rel=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "olmo2"])
def test_a_plain_q_norm_gain_carries_the_attention_factor_with_the_folds_optimizer_factors(family):
    """Where q_norm is a plain gain (weight · RMSNorm(q)), the factor f = √(d_base/d) goes on that
    gain: initial weight × f, lr × f, wd / f, ε / f (handoff/fold.py's derivation); q_proj keeps α = 1.
    And the plain model with those groups trains as the µP model step for step."""
    from hptransfer.data import load_corpus

    spec = _attn_spec(ATTN_FAMILIES[family])
    mup = build_model(spec, WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)
    folded = _fold(mup)
    f = math.sqrt((BASE_WIDTH // 2) / (WIDTH // 2))
    p = "model.layers.0.self_attn."
    twin = dict(folded.model.named_parameters())
    ref = dict(mup.named_parameters())
    torch.testing.assert_close(twin[p + "q_norm.weight"], ref[p + "q_norm.weight"] * f, rtol=1e-6, atol=0)
    torch.testing.assert_close(twin[p + "q_proj.weight"], ref[p + "q_proj.weight"], rtol=0, atol=0)
    assert folded.mults[p + "q_norm.weight"] == pytest.approx((f, 0.0, 1 / f), rel=1e-12)  # 1-D: no decay to divide
    assert folded.mults[p + "q_proj.weight"][2] == 1.0

    groups = [
        {"params": [q], "lr": HPS.lr * lr, "weight_decay": HPS.weight_decay * wd, "eps": 1e-8 * eps}
        for n, q in folded.model.named_parameters()
        for lr, wd, eps in [folded.mults[n]]
    ]
    runs = [(mup, build_optimizer(mup, "mup", HPS)), (folded.model, torch.optim.AdamW(groups, betas=(HPS.beta1, HPS.beta2)))]
    corpus = load_corpus(0.1, 20)
    losses: list[list[float]] = [[], []]
    for step in range(5):
        x, y = corpus.batch("train", step, 8, 16)
        for (model, opt), out in zip(runs, losses):
            loss = lm_loss(lm_logits(model.train(), x), y)
            out.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert max(abs(a - b) / b for a, b in zip(*losses)) < 1e-4, losses
    assert losses[0][-1] < losses[0][0] - 0.2


def test_gemma3_q_norm_refuses_the_attention_fold_with_the_fix():
    """Gemma3's q_norm multiplies by 1 + weight: the factor can be neither in q_proj (normalised away)
    nor a per-parameter scale of that gain. Refused, naming the family, the norm and the alternative."""
    spec = _attn_spec({"model_type": "gemma3_text", "num_attention_heads": 2, "num_key_value_heads": 1})
    mup = build_model(spec, WIDTH, base_width=BASE_WIDTH, hps=HPS, seed=0)
    with pytest.raises(NotImplementedError) as e:
        _fold(mup)
    msg = str(e.value)
    assert "Gemma3" in msg and "q_norm" in msg and "attn_scale: 1/sqrt(d)" in msg, msg
