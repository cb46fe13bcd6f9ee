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

Post-branch norms. OLMo2 and Gemma2/3 normalise each branch's output after its last linear layer
(h + RMSNorm(F(h)) with `post_attention_layernorm` and `post_feedforward_layernorm`; OLMo2 has no
pre-norm at all), and a norm removes any scale folded into the layer before it: there β goes on the
post-branch norm instead. That is exact only where the norm's gain multiplies its output elementwise
(OLMo2: weight · RMSNorm(x), so β·norm(x) is the norm with gain β·weight, and the fold's lr × β,
wd / β, ε / β apply to the gain). Gemma's gain enters as (1 + weight), which no per-parameter scale
turns into β × the output: refused, with what to use instead. `plain_gain` tells the two apart by
what the norm computes, not by its class name.
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
BLOCK_MODULE = re.compile(r"(?:^|\.)(?:layers|h)\.\d+$")
# Norms applied to a branch's output, before the residual add: (after attention, after the MLP). A block
# is recognised by its MLP-side name, which has no other meaning (Llama's `post_attention_layernorm` is
# the MLP's pre-norm; beside a `post_feedforward_layernorm` it is the attention's post-norm).
POST_BRANCH_NORMS = (("post_attention_layernorm", "post_feedforward_layernorm"),)


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


@torch.no_grad()
def plain_gain(norm: nn.Module) -> bool:
    """Whether `norm`'s output is its gain (and bias) times something that does not depend on them,
    so that scaling the gain (and bias) by c scales the output by c: weight · RMSNorm(x) (Llama, OLMo2,
    Qwen3) or LayerNorm, not Gemma's (1 + weight) · RMSNorm(x). Probed on the norm's own forward with
    stand-in parameters (any device, meta included; the norm is not changed)."""
    w = getattr(norm, "weight", None)
    if not isinstance(w, torch.Tensor) or w.ndim != 1:
        return False
    g, cpu = torch.Generator().manual_seed(0), {"dtype": torch.float64, "device": "cpu"}  # cpu also under a meta-device context
    params = {"weight": torch.rand(w.shape[0], generator=g, **cpu) + 0.5}
    if isinstance(getattr(norm, "bias", None), torch.Tensor):
        params["bias"] = torch.randn(w.shape[0], generator=g, **cpu)
    x = torch.randn(3, w.shape[0], generator=g, **cpu)
    try:
        y1 = torch.func.functional_call(norm, params, (x,))
        y2 = torch.func.functional_call(norm, {k: 2 * v for k, v in params.items()}, (x,))
    except Exception:  # a norm that cannot run on stand-ins: not known to be a plain gain
        return False
    return bool(torch.allclose(y2.double(), 2 * y1.double(), rtol=1e-5, atol=1e-7))


def _post_branch_norms(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The post-branch norms of every block when the model has them (two per block), else None;
    raises where one is not a plain gain."""
    found = []
    for name, block in model.named_modules():
        if not BLOCK_MODULE.search(name):
            continue
        pair = next((p for p in POST_BRANCH_NORMS if isinstance(getattr(block, p[1], None), nn.Module)), None)
        if pair is None:
            continue
        for attr in pair:
            norm = getattr(block, attr)
            if not plain_gain(norm):
                family = type(model).__name__.removesuffix("ForCausalLM")
                raise NotImplementedError(
                    f"depth_parametrization on {family}: its blocks normalise each branch's output after o_proj/down_proj "
                    f"({' and '.join(pair)}, {type(norm).__name__}), which removes a branch multiplier folded into those "
                    "layers, and the norm's gain enters as (1 + weight), so the multiplier cannot be moved onto it as a "
                    "per-parameter scale either; use depth_parametrization: none (with the target at the ladder's depth), "
                    "or a family whose branches end in their output projection (llama, qwen2, qwen3, mistral) or in a "
                    "plain-gain post-norm (olmo2)"
                )
            found.append((f"{name}.{attr}" if name else attr, norm))
    return found or None


def branch_outputs(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The last layer of every residual branch (two per block) whose output the residual stream adds:
    the branch's last linear layer, or its post-branch norm where the block has one (OLMo2)."""
    post = _post_branch_norms(model)
    if post is not None:
        return post
    found = [(n, m) for n, m in model.named_modules() if BRANCH_OUTPUT.search(n)]
    if not found:
        raise NotImplementedError(
            f"no residual-branch output layer found in {type(model).__name__} (looked for o_proj/down_proj, c_proj, "
            "dense/dense_4h_to_h inside numbered blocks); depth_parametrization needs a pre-norm residual transformer"
        )
    return found


@torch.no_grad()
def scale_branch_init(model: nn.Module, s: DepthScaling) -> None:
    """The fold's initial weights: each branch's output layer (or post-branch norm gain) × β (weight
    and bias)."""
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
