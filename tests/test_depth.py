"""Depth parametrizations (models/depth.py): CompleteP and depth-µP on every family with residual
blocks, folded into the weights and optimizer groups; the coordinate check over depth tells them
from standard residuals."""

from __future__ import annotations

import copy

import pytest
import torch

from hptransfer.errors import SpecError
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.models import build_model, build_optimizer, lm_logits
from hptransfer.models.build import lm_loss
from hptransfer.models.depth import branch_outputs, depth_scaling, explicit_multipliers, param_factors, rescale_optimizer
from hptransfer.spec import ModelSpec, parse_spec

from conftest import tiny_spec_dict

FAMILIES = {
    "llama": {"family": "llama", "head_dim": 8},
    "qwen2": {
        "family": "hf",
        "head_dim": 8,
        "config": {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2},
    },
    "gpt2": {
        "family": "hf",
        "head_dim": 8,
        "config": {"model_type": "gpt2", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    },
}
HPS = Hyperparameters(lr=0.02, weight_decay=0.1, output_mult=2.0)
# The depth rules at depth ratio m_L = 4 / 2 = 2, written out from their papers (not read from the
# product): β = m_L^(−α), hidden LR × m_L^(α−1), hidden ε × m_L^(−α); CompleteP α = 1, Depth-µP α = ½.
RULE_AT_RATIO_2 = {
    "completep": {"branch": 0.5, "hidden_lr": 1.0, "hidden_eps": 0.5},
    "depth-mup": {"branch": 2**-0.5, "hidden_lr": 2**-0.5, "hidden_eps": 2**-0.5},
}


def _spec(family: str, dp: str, depth: int = 4, base_depth: int = 2) -> ModelSpec:
    return ModelSpec(
        **FAMILIES[family], depth=depth, seq_len=16, parametrization="mup", depth_parametrization=dp, base_depth=base_depth
    )


@pytest.mark.parametrize("dp", list(RULE_AT_RATIO_2))
def test_the_depth_rule_has_its_papers_values_at_depth_ratio_2(dp):
    s = depth_scaling(_spec("llama", dp))
    want = RULE_AT_RATIO_2[dp]
    assert (s.branch, s.hidden_lr, s.hidden_eps) == pytest.approx(
        (want["branch"], want["hidden_lr"], want["hidden_eps"]), rel=1e-12
    )
    assert depth_scaling(_spec("llama", "none")) is None
    # The fold: a branch's output layer takes lr × β, wd / β, ε / β on top of the hidden rule; any other
    # parameter inside a block takes the hidden rule alone; embeddings and readout are not touched.
    model = build_model(_spec("llama", dp), 32, base_width=16, hps=HPS, seed=0)
    factors = param_factors(model, s)
    branch = {id(p) for _, m in branch_outputs(model) for p in m.parameters(recurse=False)}
    b, lr, eps = want["branch"], want["hidden_lr"], want["hidden_eps"]
    for name, p in model.named_parameters():
        if id(p) in branch:
            assert factors[id(p)] == pytest.approx((lr * b, 1 / b, eps / b), rel=1e-12), name
        elif ".layers." in name:
            assert factors[id(p)] == pytest.approx((lr, 1.0, eps), rel=1e-12), name
        else:
            assert id(p) not in factors, name


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dp", ["depth-mup", "completep"])
def test_each_depth_parametrization_builds_with_its_branch_multiplier_folded_in(family, dp):
    plain = build_model(_spec(family, "none"), 32, base_width=16, hps=HPS, seed=0)
    scaled = build_model(_spec(family, dp), 32, base_width=16, hps=HPS, seed=0)
    beta = {"depth-mup": 0.5**0.5, "completep": 0.5}[dp]  # depth 4 over base 2
    outs = dict(branch_outputs(scaled))
    assert len(outs) == 2 * 4  # attention and MLP output of each block
    plain_params = dict(plain.named_parameters())
    for name, p in scaled.named_parameters():
        module = name.rsplit(".", 1)[0]
        want = plain_params[name] * (beta if module in outs else 1.0)
        torch.testing.assert_close(p, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("dp", ["depth-mup", "completep"])
def test_the_folded_form_trains_as_the_explicit_branch_multiplier(family, dp):
    """β in the forward pass with the hidden LR/ε rule, against β folded into the branch outputs'
    initial weights with lr·β, wd/β, ε/β: the same losses step for step."""
    from hptransfer.data import load_corpus

    spec = _spec(family, dp)
    s = depth_scaling(spec)
    folded = build_model(spec, 32, base_width=16, hps=HPS, seed=0)
    explicit = copy.deepcopy(folded)
    from mup.shape import apply_infshapes, get_infshapes

    apply_infshapes(explicit, get_infshapes(folded))  # deepcopy drops `infshape`
    explicit_multipliers(explicit, s)
    want = RULE_AT_RATIO_2[dp]  # the rule without the fold, from the papers' values
    hidden_only = dict.fromkeys(param_factors(explicit, s), (want["hidden_lr"], 1.0, want["hidden_eps"]))
    opts = [
        build_optimizer(folded, "mup", HPS, depth=s),
        rescale_optimizer(build_optimizer(explicit, "mup", HPS), hidden_only),
        build_optimizer(folded, "mup", HPS),  # the depth rule dropped: fewer groups
    ]
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
    rel = max(abs(a - b) / b for a, b in zip(*losses))
    assert rel < 1e-4, losses
    assert losses[0][-1] < losses[0][0] - 0.2  # it trains
    lrs = sorted({g["lr"] for g in opts[0].param_groups})
    assert len(lrs) > len({g["lr"] for g in opts[2].param_groups})  # the folded groups carry the rule


@pytest.mark.slow
def test_depth_coordinate_check_passes_for_completep_and_fails_for_none():
    from hptransfer.coordcheck_depth import _slope, residual_changes
    from hptransfer.data import load_corpus

    batch = load_corpus(0.1, 20).batch("train", 0, 8, 16)
    slopes = {}
    for dp in ("none", "completep"):
        spec = ModelSpec(family="llama", head_dim=8, depth=2, seq_len=16, parametrization="mup", depth_parametrization=dp)
        recs = residual_changes(spec, 16, [2, 4, 8, 16], Hyperparameters(), batch, steps=4, lr=1e-2)
        last = [r["change"] for r in recs if r["t"] == 4]
        slopes[dp] = _slope([2, 4, 8, 16], last)
    assert slopes["none"] > 0.5, slopes  # standard residuals: the stream's change grows ~∝ depth
    assert abs(slopes["completep"]) < 0.5, slopes


def test_depth_fields_are_validated_with_the_fix():
    with pytest.raises(SpecError) as e:
        parse_spec(tiny_spec_dict(model={"depth_parametrization": "completep"}))  # the mlp family
    assert "model" in str(e.value) and "depth_parametrization" in str(e.value) and "llama or hf" in str(e.value)
    with pytest.raises(SpecError, match="depth_parametrization"):
        parse_spec(tiny_spec_dict(model={"family": "llama", "depth_parametrization": "complete-p"}))
    with pytest.raises(SpecError, match="base_depth"):
        parse_spec(tiny_spec_dict(model={"family": "llama", "base_depth": 0}))
    with pytest.raises(SpecError, match="depths"):
        parse_spec(tiny_spec_dict(coord_check={"depths": [4]}))
    ok = parse_spec(tiny_spec_dict(model={"family": "llama", "depth_parametrization": "completep", "base_depth": 2}))
    assert depth_scaling(ok.model, 8).branch == pytest.approx(0.25)


def test_depth_fields_at_their_defaults_keep_old_hashes():
    from hptransfer.spec import spec_hash, sweep_hash

    base = parse_spec(tiny_spec_dict(model={"family": "llama"}))
    same = parse_spec(tiny_spec_dict(model={"family": "llama", "depth_parametrization": "none"}))
    other = parse_spec(tiny_spec_dict(model={"family": "llama", "depth_parametrization": "completep"}))
    assert sweep_hash(same) == sweep_hash(base) and spec_hash(same) == spec_hash(base)
    assert sweep_hash(other) != sweep_hash(base)
    assert "depth_parametrization" not in base.model_dump_json(exclude={"model": {"depth_parametrization"}})


def _axes_table():
    import numpy as np

    from hptransfer.transfer.synthetic import synthetic_axes_sweep

    grid = list(3e-3 * 2 ** (0.5 * np.arange(-6, 7)))
    base = {"steps": 100, "batch_size": 16, "depth": 2}
    return synthetic_axes_sweep([32, 64, 128], grid, base=base, arms={}, exponents={}, noise=0.003, seeds=(0, 1), rng_seed=0)


def test_a_target_deeper_than_the_ladder_is_warned_under_none_and_keeps_its_base_depth_under_completep():
    from hptransfer.models.depth import depth_scaling
    from hptransfer.transfer.engine import make_plan, standalone_spec

    df = _axes_table()
    none = make_plan(standalone_spec(df, rule="mup", target_width=1024, target_depth=16, model={"family": "llama"}), df)
    warn = [w for w in none.diagnostics.warnings if "deeper than every depth" in w]
    assert warn and "depth_parametrization: completep" in warn[0]
    model = {"family": "llama", "depth_parametrization": "completep"}
    cp = make_plan(standalone_spec(df, rule="mup", target_width=1024, target_depth=16, model=model), df)
    assert not any("deeper than every depth" in w for w in cp.diagnostics.warnings)
    assert (cp.model.depth, cp.model.base_depth) == (16, 2)  # the rule stays relative to the ladder's depth
    assert depth_scaling(cp.model).branch == pytest.approx(2 / 16)
    assert cp.axes["laws"]["depth"]["verdict"] == "cannot tell" and "2505.01618" in cp.axes["laws"]["depth"]["prior_source"]


def test_depth_arms_are_counted_and_the_ladder_depth_is_refused_among_them():
    spec = parse_spec(tiny_spec_dict(model={"family": "llama"}, sweep={"axes": {"depth": [4, 8]}}))
    assert spec.sweep.n_arms == 2 + 2 and spec.model.at_depth(8).base_depth == 2
    with pytest.raises(SpecError, match=r"sweep.axes.depth.*model.depth=2"):
        parse_spec(tiny_spec_dict(model={"family": "llama"}, sweep={"axes": {"depth": [2, 4]}}))
