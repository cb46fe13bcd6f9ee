"""The hand-off folder: plain `transformers` gives the run's logits (µP's readout multiplier folded
into `lm_head`), and `load_handoff` gives back the µP model that continues training exactly.

Width 48 over base 16: width_mult 3, so the fold factor output_mult/3 is not a power of two and the
fold is not exact in floating point. output_mult = 2 so SP's readout has a multiplier to fold too."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from hptransfer.data import load_corpus
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.models import build_model, build_optimizer, lm_logits
from hptransfer.models.handoff import (
    BASE_SHAPES_FILE,
    HANDOFF_FILE,
    PLAN_FILE,
    _scale_queries,
    load_handoff,
    read_handoff,
    save_handoff,
)
from hptransfer.spec import ModelSpec

WIDTH, BASE, SEQ = 48, 16, 16
HPS = Hyperparameters(lr=1e-2, output_mult=2.0)


def _corpus():
    return load_corpus(0.1, 20)


def _loss(model, batches) -> float:
    with torch.no_grad():
        return sum(
            torch.nn.functional.cross_entropy(lm_logits(model, x).flatten(0, 1), y.flatten()).item() for x, y in batches
        ) / len(batches)


def _adam_steps(model, parametrization: str, steps: int, start: int = 0):
    opt = build_optimizer(model, parametrization, HPS)
    model.train()
    for step in range(start, start + steps):
        x, y = _corpus().batch("train", step, 8, SEQ)
        loss = torch.nn.functional.cross_entropy(lm_logits(model, x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _trained(parametrization: str):
    spec = ModelSpec(family="llama", depth=2, head_dim=8, seq_len=SEQ, parametrization=parametrization)
    model = build_model(spec, WIDTH, base_width=BASE, hps=HPS, seed=0)
    return spec, _adam_steps(model, parametrization, 4)


@pytest.fixture(scope="module")
def val():
    return _corpus().val_batches(2, 8, SEQ)


@pytest.fixture(scope="module")
def mup_run(tmp_path_factory):
    spec, model = _trained("mup")
    out = tmp_path_factory.mktemp("handoff") / "hf_model"
    plan = {"study": "handoff-test", "model": spec.model_dump(mode="json"), "target": {"width": WIDTH}}
    assert save_handoff(model, out, spec_model=spec, width=WIDTH, base_width=BASE, plan_dict=plan) == out
    return spec, model, out


def test_plain_transformers_gives_the_runs_logits_and_loss(mup_run, val, tmp_path):
    _, model, out = mup_run
    assert model.lm_head.weight.abs().max() > 1e-3  # the zero-initialised readout has trained
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(plain.lm_head) is torch.nn.Linear  # nothing of mup or hptransfer needed
    x = val[0][0]
    with torch.no_grad():
        ours, theirs = lm_logits(model, x), lm_logits(plain, x)
    assert torch.allclose(theirs, ours, rtol=1e-4, atol=1e-4 * ours.abs().max().item())
    assert _loss(plain, val) == pytest.approx(_loss(model, val), rel=1e-4)

    # The bug this fixes: plain save_pretrained keeps the un-folded weight, logits ×3/2 here.
    model.save_pretrained(tmp_path / "naive")
    naive = AutoModelForCausalLM.from_pretrained(tmp_path / "naive").eval()
    assert _loss(naive, val) != pytest.approx(_loss(model, val), rel=1e-2)


def test_folder_carries_base_shapes_and_plan(mup_run):
    spec, _, out = mup_run
    meta = read_handoff(out)
    assert meta["readout"] == {
        "kind": "MuReadout",
        "output_mult": 2.0,
        "width_mult": WIDTH / BASE,
        "folded_scale": 2.0 / (WIDTH / BASE),
        "bias": False,
        "tied": False,
        "untied_on_save": False,
    }
    assert ModelSpec.model_validate(meta["model"]) == spec and (meta["width"], meta["base_width"]) == (WIDTH, BASE)
    assert "lm_head.weight" in (out / BASE_SHAPES_FILE).read_text()
    assert "handoff-test" in (out / PLAN_FILE).read_text()


def test_load_handoff_restores_mup_and_continues_training_exactly(mup_run, val):
    from mup import MuReadout

    _, model, out = mup_run
    loaded = load_handoff(out)
    assert isinstance(loaded.lm_head, MuReadout) and loaded.lm_head.width_mult() == WIDTH / BASE
    assert loaded.lm_head.output_mult == 2.0
    assert all(hasattr(p, "infshape") for p in loaded.parameters())
    assert torch.allclose(loaded.lm_head.weight, model.lm_head.weight, rtol=1e-6, atol=0)  # un-folded
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    assert _loss(loaded, val) == pytest.approx(_loss(plain, val), rel=1e-5)
    assert _loss(loaded, val) == pytest.approx(_loss(model, val), rel=1e-5)
    # MuAdamW sees the same per-group LRs (hidden matrices lr/width_mult), and two more steps agree.
    lrs = lambda m: sorted(g["lr"] for g in build_optimizer(m, "mup", HPS).param_groups)
    assert lrs(loaded) == lrs(model)
    import copy

    from mup.shape import apply_infshapes, get_infshapes

    ref = copy.deepcopy(model)
    apply_infshapes(ref, get_infshapes(model))  # deepcopy drops the `infshape` attributes
    cont_ref, cont = _adam_steps(ref, "mup", 2, start=4), _adam_steps(loaded, "mup", 2, start=4)
    assert _loss(cont, val) == pytest.approx(_loss(cont_ref, val), rel=1e-5)


def test_sp_model_with_output_mult(val, tmp_path):
    from hptransfer.models.build import ScaledReadout

    spec, model = _trained("sp")
    assert isinstance(model.lm_head, ScaledReadout)
    save_handoff(model, tmp_path / "sp", spec_model=spec, width=WIDTH, base_width=BASE)
    assert not (tmp_path / "sp" / BASE_SHAPES_FILE).exists() and not (tmp_path / "sp" / PLAN_FILE).exists()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "sp").eval()
    assert _loss(plain, val) == pytest.approx(_loss(model, val), rel=1e-4)
    model.save_pretrained(tmp_path / "naive")
    naive = AutoModelForCausalLM.from_pretrained(tmp_path / "naive").eval()
    assert _loss(naive, val) != pytest.approx(_loss(model, val), rel=1e-2)
    loaded = load_handoff(tmp_path / "sp")
    assert isinstance(loaded.lm_head, ScaledReadout) and loaded.lm_head.output_mult == 2.0
    assert _loss(loaded, val) == pytest.approx(_loss(model, val), rel=1e-5)


def _tied_llama(width: int):
    from mup import MuSharedReadout
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=1,
        num_attention_heads=width // 8,
        num_key_value_heads=width // 8,
        head_dim=8,
        max_position_embeddings=SEQ,
        tie_word_embeddings=True,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    model.lm_head = MuSharedReadout(model.get_input_embeddings().weight, bias=False, output_mult=2.0)
    return model


def test_tied_mup_readout_is_saved_untied_and_tied_again(val, tmp_path):
    from mup import MuSharedReadout, set_base_shapes

    torch.manual_seed(0)
    model = _tied_llama(WIDTH)
    with torch.device("meta"):
        base, delta = _tied_llama(BASE), _tied_llama(2 * BASE)
    set_base_shapes(model, base, delta=delta)
    model = _adam_steps(model, "mup", 3)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    spec = ModelSpec(family="llama", depth=1, head_dim=8, seq_len=SEQ)
    save_handoff(model, tmp_path / "tied", spec_model=spec, width=WIDTH, base_width=BASE)
    assert read_handoff(tmp_path / "tied")["readout"]["untied_on_save"] is True
    assert model.config.tie_word_embeddings is True  # the live model is left as it was
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "tied").eval()
    assert plain.config.tie_word_embeddings is False
    assert _loss(plain, val) == pytest.approx(_loss(model, val), rel=1e-4)
    loaded = load_handoff(tmp_path / "tied")
    assert isinstance(loaded.lm_head, MuSharedReadout)
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    assert _loss(loaded, val) == pytest.approx(_loss(model, val), rel=1e-5)


def test_mlp_family_has_no_hf_form(tmp_path):
    spec = ModelSpec(family="mlp", depth=1, seq_len=SEQ)
    model = build_model(spec, WIDTH, base_width=BASE, hps=HPS, seed=0)
    assert save_handoff(model, tmp_path / "mlp", spec_model=spec, width=WIDTH, base_width=BASE) is None
    assert not (tmp_path / "mlp").exists()


def test_old_folder_without_handoff_metadata_is_refused(tmp_path):
    _, model = _trained("mup")
    model.save_pretrained(tmp_path / "old")
    with pytest.raises(FileNotFoundError, match=HANDOFF_FILE):
        load_handoff(tmp_path / "old")


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "qwen2", "num_attention_heads": 2, "num_key_value_heads": 1},  # q_proj, grouped KV heads
        {"model_type": "gpt2", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},  # fused Conv1D c_attn, tied
        {"model_type": "gpt_neox", "hidden_dropout": 0.0, "attention_dropout": 0.0},  # fused, per-head interleaved qkv
    ],
    ids=["qwen2", "gpt2", "gpt_neox"],
)
def test_attention_scale_1_over_d_is_folded_into_the_queries(config, val, tmp_path):
    """µP's q·k/d (fixed head count, head size growing with width) reaches plain transformers."""
    spec = ModelSpec(family="hf", config=config, depth=1, n_heads=2, attn_scale="1/d", seq_len=SEQ, parametrization="mup")
    model = build_model(spec, 4 * BASE, base_width=BASE, hps=HPS, seed=0)
    torch.manual_seed(0)
    with torch.no_grad():  # trained-like weights: q·k large enough that the attention scale changes the logits
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    scaled = {n: m.scaling for n, m in model.named_modules() if isinstance(getattr(m, "scaling", None), float)}
    assert scaled and all(s == pytest.approx((4 * BASE // 2) ** -0.5 * 0.5) for s in scaled.values())  # √(d_base/d)/√d
    save_handoff(model, tmp_path / "h", spec_model=spec, width=4 * BASE, base_width=BASE)
    assert set(read_handoff(tmp_path / "h")["attn_scale_folded"]) == set(scaled)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "h").eval()
    x = val[0][0]
    torch.testing.assert_close(lm_logits(plain, x), lm_logits(model.eval(), x), rtol=1e-4, atol=1e-4)
    unfolded = AutoModelForCausalLM.from_pretrained(tmp_path / "h").eval()  # the fold undone: other logits
    _scale_queries(unfolded, {n: 1 / f for n, f in read_handoff(tmp_path / "h")["attn_scale_folded"].items()})
    assert not torch.allclose(lm_logits(unfolded, x), lm_logits(model, x), atol=1e-3)
    loaded = load_handoff(tmp_path / "h").eval()
    assert {n: m.scaling for n, m in loaded.named_modules() if n in scaled} == pytest.approx(scaled)
    torch.testing.assert_close(lm_logits(loaded, x), lm_logits(model, x), rtol=1e-5, atol=1e-5)
