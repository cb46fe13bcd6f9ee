"""Depth parametrizations: how residual branches, LRs and Adam's ε scale with the number of blocks L.

A pre-norm residual network computes h_{l+1} = h_l + β·F_l(h_l) for each branch F_l (attention, MLP).
With depth ratio m_L = L / L_base (`model.base_depth`), the family of depth parametrizations is
indexed by α (Bordelon et al.; Yang et al. arXiv 2310.02244; Dey et al., CompleteP, arXiv 2505.01618):

    branch multiplier      β          = m_L^(−α)
    hidden LR              η_hidden   × m_L^(α − 1)   (weights, norms and biases inside the blocks)
    hidden Adam ε          ε_hidden   × m_L^(−α)
    weight decay           unchanged in depth (µP's width rule still applies: MuAdamW's λ·m_N)
    init                   unchanged in depth (std ∝ 1/√fan_in, as µP in width)

`none` is α = 0 (β = 1: the standard residual, whose update of the residual stream grows ∝ L);
`depth-mup` is α = ½ (Depth-µP: β = 1/√L, hidden LR 1/√m_L); `completep` is α = 1 (β = 1/L, hidden
LR unchanged), the only α whose every layer learns non-lazily (CompleteP, Table 1). The rules are
those of the paper's reference implementation (EleutherAI/nanoGPT-mup, branch `completep`: hidden
LR × m_L^(α−1), hidden ε × m_L^(−α) — the ε term was a later fix, arXiv 2512.22382 — weight decay
without a depth factor). Our µP keeps ε constant in width (as `mup.MuAdamW` does), so only the depth
part of CompleteP's ε rule is applied. Assumption, stated: embeddings, the final norm and the readout
are not "hidden" and keep their width-µP settings.

Expressed as a fold (handoff/fold.py's derivation): the branch multiplier β on a branch whose last
layer is linear (o_proj and down_proj in Llama/Qwen2/Mistral, GPT-2's c_proj, GPT-NeoX's dense and
dense_4h_to_h) equals that layer with its initial weights (and bias) × β, LR × β, weight decay / β
and ε / β. So the model stays a plain architecture: `build_model` scales those initial weights and
`build_optimizer` the groups; `explicit_multipliers` puts β back into the forward pass instead, for
the test that both forms train alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

DEPTH_PARAMETRIZATIONS = ("none", "depth-mup", "completep")
ALPHA = {"none": 0.0, "depth-mup": 0.5, "completep": 1.0}

# A parameter inside a residual block (`model.layers.3.` in Llama/Qwen2/Mistral, `transformer.h.3.` in
# GPT-2, `gpt_neox.layers.3.` in GPT-NeoX), and the last linear layer of each residual branch.
BLOCK = re.compile(r"(?:^|\.)(?:layers|h)\.\d+\.")
BRANCH_OUTPUT = re.compile(
    r"(?:^|\.)(?:layers|h)\.\d+\.(?:self_attn\.o_proj|mlp\.down_proj|attn\.c_proj|mlp\.c_proj|attention\.dense|mlp\.dense_4h_to_h)$"
)


@dataclass(frozen=True)
class DepthScaling:
    """The depth rule at depth ratio `ratio` = L / L_base with exponent `alpha`."""

    alpha: float
    ratio: float

    @property
    def branch(self) -> float:
        return self.ratio**-self.alpha

    @property
    def hidden_lr(self) -> float:
        return self.ratio ** (self.alpha - 1)

    @property
    def hidden_eps(self) -> float:
        return self.ratio**-self.alpha

    @property
    def identity(self) -> bool:
        return self.alpha == 0.0 or self.ratio == 1.0


def depth_scaling(spec: Any, depth: int | None = None) -> DepthScaling | None:
    """The rule for a model spec at `depth` (default the spec's), or None for `none`."""
    name = getattr(spec, "depth_parametrization", "none") or "none"
    if name == "none":
        return None
    depth = depth or spec.depth
    base = getattr(spec, "base_depth", None) or spec.depth
    return DepthScaling(ALPHA[name], depth / base)


def branch_outputs(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The last linear layer of every residual branch (two per block)."""
    found = [(n, m) for n, m in model.named_modules() if BRANCH_OUTPUT.search(n)]
    if not found:
        raise NotImplementedError(
            f"no residual-branch output layer found in {type(model).__name__} (looked for o_proj/down_proj, c_proj, "
            "dense/dense_4h_to_h inside numbered blocks); depth_parametrization needs a pre-norm residual transformer"
        )
    return found


@torch.no_grad()
def scale_branch_init(model: nn.Module, s: DepthScaling) -> None:
    """The fold's initial weights: each branch's output layer × β (weight and bias)."""
    for _, module in branch_outputs(model):
        module.weight.mul_(s.branch)
        if getattr(module, "bias", None) is not None:
            module.bias.mul_(s.branch)


def param_factors(model: nn.Module, s: DepthScaling) -> dict[int, tuple[float, float, float]]:
    """id(parameter) → (lr ×, weight decay ×, ε ×) of the depth rule in its folded form."""
    out = {}
    folded = {id(p) for _, m in branch_outputs(model) for p in m.parameters(recurse=False)}
    for name, p in model.named_parameters():
        if not BLOCK.search(name):
            continue
        lr, wd, eps = s.hidden_lr, 1.0, s.hidden_eps
        if id(p) in folded:  # β folded into this layer's weights: lr × β, wd / β, ε / β
            lr, wd, eps = lr * s.branch, wd / s.branch, eps / s.branch
        out[id(p)] = (lr, wd, eps)
    return out


def rescale_optimizer(opt: torch.optim.Optimizer, factors: dict[int, tuple[float, float, float]]) -> torch.optim.Optimizer:
    """A new AdamW with each of `opt`'s groups split so every parameter carries its factors (before
    any step: there is no state to carry)."""
    groups = []
    for g in opt.param_groups:
        split: dict[tuple[float, float, float], list] = {}
        for p in g["params"]:
            split.setdefault(factors.get(id(p), (1.0, 1.0, 1.0)), []).append(p)
        for (lr, wd, eps), params in split.items():
            groups.append(
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": params,
                    "lr": g["lr"] * lr,
                    "weight_decay": g["weight_decay"] * wd,
                    "eps": g["eps"] * eps,
                }
            )
    d = opt.defaults
    return torch.optim.AdamW(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"])


def explicit_multipliers(model: nn.Module, s: DepthScaling) -> list[Any]:
    """The unfolded form, for comparison: divide the folded branch weights by β again and multiply
    each branch's output by β in the forward pass instead. Returns the hook handles."""
    handles = []
    with torch.no_grad():
        for _, module in branch_outputs(model):
            module.weight.div_(s.branch)
            if getattr(module, "bias", None) is not None:
                module.bias.div_(s.branch)
            handles.append(module.register_forward_hook(lambda _m, _i, out, b=s.branch: out * b))
    return handles
