"""Family `hf`: each architecture gets the right config fields at every width, builds with µP's
readout and base shapes, passes the µP coordinate check and trains a few steps under SP and µP.
All built offline from configs (no hub)."""

from __future__ import annotations

import math

import pytest
import torch

from hptransfer import coordcheck
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.models import build_model, lm_logits
from hptransfer.models.families import hf_config
from hptransfer.spec import SpecError, load_spec, parse_spec
from hptransfer.study import Study
from hptransfer.sweep.trial import train_proxy

from conftest import ROOT, tiny_spec_dict

NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
ARCHS = {  # model.config per architecture; the two shipped ones as in search_spaces/
    "qwen2-gqa": {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2},
    "gpt2": {"model_type": "gpt2", **NO_DROPOUT},
    "mistral": {"model_type": "mistral", "num_attention_heads": 4, "num_key_value_heads": 2},
    "gpt_neox": {"model_type": "gpt_neox"},
}
GROUP = {"qwen2-gqa": 2, "gpt2": 1, "mistral": 2, "gpt_neox": 1}
# Modules the shipped coordinate check must see per architecture (not just the embedding and the
# head): GPT-2's Conv1D blocks and GPT-NeoX's fused projections included. No patching: these tests
# run hptransfer.coordcheck as a user's `hpt coord-check` does.
HIDDEN = {
    "qwen2-gqa": ("q_proj", "k_proj", "down_proj"),
    "gpt2": ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"),
    "mistral": ("q_proj", "k_proj", "down_proj"),
    "gpt_neox": ("query_key_value", "dense_4h_to_h"),
}
SHIPPED = {"qwen2-gqa": "qwen2-gqa.yaml", "gpt2": "gpt2.yaml"}


def _spec(arch: str, par: str = "mup", widths=(32, 64), **model):
    return parse_spec(
        tiny_spec_dict(
            model={
                "family": "hf",
                "config": ARCHS[arch],
                "parametrization": par,
                "head_dim": 16,
                "seq_len": 32,
                "depth": 2,
                **model,
            },
            sweep={"widths": list(widths), "steps": 8, "batch_size": 8},
            target={"width": max(128, widths[-1])},
        )
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_width_maps_onto_config_fields(arch):
    spec = _spec(arch).model
    for width in (32, 128):
        cfg = hf_config(spec, width)
        heads = width // 16
        assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers) == (width, heads, 2)
        assert cfg.vocab_size == 256 and cfg.max_position_embeddings == 32 and cfg.use_cache is False
        kv = getattr(cfg, "num_key_value_heads", heads)
        assert heads // kv == GROUP[arch]  # grouped-query attention keeps its group size
        model = build_model(spec, width, base_width=32)
        assert sum(p.numel() for p in model.parameters()) > 0
        x = torch.randint(0, 256, (2, 32))
        assert lm_logits(model, x).shape == (2, 32, 256)
        ffn = getattr(cfg, "intermediate_size", None) or cfg.n_inner
        assert ffn == 4 * width


@pytest.mark.parametrize("arch", ARCHS)
def test_mup_readout_and_base_shapes(arch):
    from mup import MuReadout, MuSharedReadout

    from hptransfer.models.build import ScaledReadout

    model = build_model(_spec(arch).model, 128, base_width=32)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = arch == "gpt2"
    assert isinstance(head, MuSharedReadout if tied else MuReadout)
    assert (head.weight is embed.weight) is tied
    assert head.width_mult() == 4.0
    assert all(hasattr(p, "infshape") for p in model.parameters())
    if not tied:
        assert float(head.weight.detach().abs().max()) == 0.0  # µP's zero-initialised readout
    sp = build_model(_spec(arch, "sp").model, 128, base_width=32)
    assert type(sp.get_output_embeddings()) is ScaledReadout
    assert (sp.get_output_embeddings().weight is sp.get_input_embeddings().weight) is tied


def test_conv1d_init_reads_fan_in_from_dim_0():
    """GPT-2's Conv1D stores (in, out): SP's hidden init must use dim 0 as the fan-in."""
    model = build_model(_spec("gpt2", "sp").model, 128, base_width=32, hps=Hyperparameters(init_std=0.02))
    w = model.transformer.h[0].mlp.c_proj.weight  # (4·128, 128): fan-in 512
    assert w.shape == (512, 128)
    assert float(w.std()) == pytest.approx(0.02 * math.sqrt(32 / 512), rel=0.05)


@pytest.mark.parametrize("arch", ["qwen2-gqa", "gpt2"])
def test_shipped_hf_specs_pass_the_coord_check(arch, tmp_path):
    spec = load_spec(ROOT / "search_spaces" / SHIPPED[arch])
    r = coordcheck.coord_check(Study.from_spec(spec, tmp_path))
    assert r.passed, r.slopes
    assert all(any(name in m for m in r.slopes) for name in HIDDEN[arch]), sorted(r.slopes)


@pytest.mark.parametrize("arch", ["mistral", "gpt_neox"])
def test_more_architectures_pass_the_coord_check(arch, tmp_path):
    r = coordcheck.coord_check(Study.from_spec(_spec(arch, widths=(32, 64, 128, 256)), tmp_path))
    assert r.passed, r.slopes
    assert all(any(name in m for m in r.slopes) for name in HIDDEN[arch]), sorted(r.slopes)


def test_coord_check_tells_sp_from_mup_on_conv1d(tmp_path):
    r = coordcheck.coord_check(Study.from_spec(_spec("gpt2", "sp", widths=(32, 64, 128, 256)), tmp_path))
    assert not r.passed and r.slopes["transformer.h.0.mlp.c_fc"] > 0.6, r.slopes


@pytest.mark.parametrize("par", ["sp", "mup"])
@pytest.mark.parametrize("arch", ARCHS)
def test_trains_a_few_steps(arch, par):
    spec = _spec(arch, par)
    m = train_proxy(spec, 64, Hyperparameters(lr=1e-2, warmup_steps=2), seed=0, n_reports=1)
    assert m["status"] == "ok" and m["step"] == 8
    assert m["val_loss"] < math.log(256) - 0.5, m  # learned something from 8 steps of bytes


def test_tied_weights_stay_tied_through_training():
    spec = _spec("gpt2")
    from hptransfer.models import training_setup

    run = training_setup(spec.model, 64, base_width=32, hps=Hyperparameters(), total_steps=3)
    x = torch.randint(0, 256, (4, 32))
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(lm_logits(run.model, x).reshape(-1, 256), x.reshape(-1))
        run.optimizer.zero_grad()
        loss.backward()
        run.optimizer.step()
    assert run.model.lm_head.weight is run.model.transformer.wte.weight


def test_attention_scale_one_over_d_with_a_fixed_head_count():
    """n_heads fixed: the head size grows with width; 1/d is √d_base/d (= 1/√d at the base width)."""
    spec = _spec("qwen2-gqa", n_heads=2, attn_scale="1/d").model
    scaling = lambda w: build_model(spec, w, base_width=32).model.layers[0].self_attn.scaling
    assert scaling(32) == pytest.approx(16**-0.5)  # d = 32 / 2 = 16 at the base width
    assert scaling(128) == pytest.approx(math.sqrt(16) / 64)
    standard = _spec("qwen2-gqa", n_heads=2).model
    assert build_model(standard, 128, base_width=32).model.layers[0].self_attn.scaling == pytest.approx(64**-0.5)


def test_gpt2_handoff_loads_with_plain_transformers(tmp_path):
    """Tied µP readout: the saved folder gives the live model's logits through from_pretrained."""
    from transformers import AutoModelForCausalLM

    from hptransfer.models import training_setup
    from hptransfer.models.handoff import save_handoff

    spec = _spec("gpt2")
    run = training_setup(spec.model, 64, base_width=32, hps=Hyperparameters(output_mult=2.0), total_steps=2)
    x = torch.randint(0, 256, (2, 32))
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(lm_logits(run.model, x).reshape(-1, 256), x.reshape(-1))
        run.optimizer.zero_grad()
        loss.backward()
        run.optimizer.step()
    run.model.eval()
    save_handoff(run.model, tmp_path / "hf", spec_model=spec.model, width=64, base_width=32)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(x).logits, lm_logits(run.model, x), rtol=1e-4, atol=1e-5)


def test_config_from_a_local_config_json(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("qwen2", num_attention_heads=8, num_key_value_heads=2).save_pretrained(tmp_path)
    spec = parse_spec(
        tiny_spec_dict(
            model={"family": "hf", "config": str(tmp_path), "head_dim": 16}, sweep={"widths": [64, 128]}, target={"width": 256}
        )
    )
    assert spec.model.config["model_type"] == "qwen2"  # read at load, inline in the plan from here on
    cfg = hf_config(spec.model, 128)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers) == (8, 2, 2)


BROKEN = {
    "no config": ({"family": "hf"}, {}, "needs model.config"),
    "unknown model_type": ({"family": "hf", "config": {"model_type": "qwen9"}}, {}, "unknown to transformers"),
    "not a causal LM": ({"family": "hf", "config": {"model_type": "vit"}}, {}, "not a causal LM"),
    "typo in config": ({"family": "hf", "config": {"model_type": "qwen2", "num_atention_heads": 4}}, {}, "num_atention_heads"),
    "no model_type": ({"family": "hf", "config": {"hidden_size": 4}}, {}, "needs `model_type`"),
    "missing config.json": ({"family": "hf", "config": "/nonexistent/config.json"}, {}, "not found"),
    "config on llama": ({"family": "llama", "config": {"model_type": "qwen2"}}, {}, "apply to family hf only"),
    "GQA group vs widths": (
        {"family": "hf", "head_dim": 16, "config": {"model_type": "mistral", "num_attention_heads": 8, "num_key_value_heads": 2}},
        {"widths": [32, 64]},
        "not multiples of model.head_dim=16 × 4 = 64",
    ),
    "GQA group vs n_heads": (
        {"family": "hf", "n_heads": 3, "config": ARCHS["qwen2-gqa"]},
        {"widths": [48, 96]},
        "not a multiple of the config's GQA group size 2",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_bad_hf_spec_says_what_and_how(case):
    model, sweep, words = BROKEN[case]
    with pytest.raises(SpecError) as e:
        parse_spec(tiny_spec_dict(model=model, sweep=sweep, target={"width": 192}))
    assert words in str(e.value), str(e.value)
