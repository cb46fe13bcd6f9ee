"""Per-trainer hand-off files (handoff/trainers.py): each is loaded by its own library and must give
every parameter optimizer.json's lr / weight decay / ε.

A tiny HF Llama (width 32, 2 layers, vocab 256) and a hand-written optimizer.json with distinct
multipliers per group (lm_head lr 1/8, ε ×8, wd ×8; hidden matrices lr 1/4, wd ×4; norms wd 0).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hptransfer.handoff.groups import OptimizerSpec
from hptransfer.handoff.param_names import grouped, per_param, translate

L = r"model\.layers\.\d+\."
OPTIMIZER = {
    "lr": 0.02,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "param_groups": [
        {"pattern": r"lm_head\.weight", "lr_mult": 0.125, "wd_mult": 8.0, "eps_mult": 8.0},
        {
            "pattern": L + r"(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight",
            "lr_mult": 0.25,
            "wd_mult": 4.0,
            "eps_mult": 1.0,
        },
        {
            "pattern": L + r"(input|post_attention)_layernorm\.weight|model\.norm\.weight",
            "lr_mult": 1.0,
            "wd_mult": 0.0,
            "eps_mult": 1.0,
        },
        {"pattern": r"model\.embed_tokens\.weight", "lr_mult": 1.0, "wd_mult": 1.0, "eps_mult": 1.0},
    ],
    "schedule": {"warmup_steps": 2, "total_steps": 10, "min_lr_rate": 0.1},
}
STEPS, BATCH, SEQ = 6, 4, 16


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def expected(model, opt=OPTIMIZER) -> dict[str, tuple[float, float, float]]:
    """Written here from the format's definition (first fullmatch wins), not from hptransfer."""
    out = {}
    for name, _ in model.named_parameters():
        g = next(g for g in opt["param_groups"] if re.fullmatch(g["pattern"], name))
        out[name] = (opt["lr"] * g["lr_mult"], opt["weight_decay"] * g["wd_mult"], opt["eps"] * g["eps_mult"])
    return out


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for n in want:
        assert tuple(got[n]) == pytest.approx(want[n], rel=1e-12), n


@pytest.fixture(scope="module")
def handoff(tmp_path_factory):
    """DIR with model/, optimizer.json and trainers/ written (and checked) by write_trainer_files."""
    from hptransfer.handoff.trainers import write_trainer_files

    d = tmp_path_factory.mktemp("handoff")
    tiny_llama().save_pretrained(d / "model")
    (d / "optimizer.json").write_text(json.dumps(OPTIMIZER))
    res = write_trainer_files(d / "trainers", d / "model", OPTIMIZER)
    return d, res


# ---------------------------------------------------------------- pure rules (fast)


def test_translate_merges_fused_tensors_only_when_they_agree():
    table = {"a.{}.q": ("f.{}.qkv",), "a.{}.k": ("f.{}.qkv",), "b": ("c",)}
    same = {"a.0.q": (1.0, 0.0, 1.0), "a.0.k": (1.0, 0.0, 1.0), "b": (2.0, 0.0, 1.0)}
    out, conflicts = translate(same, table)
    assert out == {"f.0.qkv": (1.0, 0.0, 1.0), "c": (2.0, 0.0, 1.0)} and conflicts == []
    out, conflicts = translate({**same, "a.0.q": (3.0, 0.0, 1.0)}, table)
    assert conflicts == ["f.0.qkv"]  # q scaled differently: reported, not merged silently
    with pytest.raises(KeyError):
        translate({"unknown.weight": (1.0, 0.0, 1.0)}, table)


def test_grouped_generalises_blocks_that_agree_and_keeps_names_that_differ():
    vals = {"l.0.w": (1.0, 0, 1), "l.1.w": (1.0, 0, 1), "l.0.v": (1.0, 0, 1), "l.1.v": (2.0, 0, 1), "head": (3.0, 0, 1)}
    assert grouped(vals, "*") == [
        (["l.*.w"], (1.0, 0, 1)),
        (["l.0.v"], (1.0, 0, 1)),
        (["l.1.v"], (2.0, 0, 1)),
        (["head"], (3.0, 0, 1)),
    ]


def test_per_param_first_match_wins_and_every_parameter_matches():
    spec = OptimizerSpec.model_validate(OPTIMIZER)
    names = [n for n, _ in tiny_llama().named_parameters()]
    assert per_param(spec, names) == expected(tiny_llama())
    with pytest.raises(ValueError, match="match no param_groups pattern"):
        per_param(spec, [*names, "extra.bias"])


def test_torchtitan_fuses_qkv_unless_q_is_scaled_apart():
    from hptransfer.handoff.to_torchtitan import torchtitan_values

    want = expected(tiny_llama())
    tt, fused = torchtitan_values(want)
    assert fused and tt["layers.1.attention.qkv_linear.wqkv.weight"] == want["model.layers.1.self_attn.q_proj.weight"]
    scaled = dict(want)
    scaled["model.layers.0.self_attn.q_proj.weight"] = (1.0, 0.1, 1e-9)  # attention scale folded into q
    tt, fused = torchtitan_values(scaled)
    assert not fused and tt["layers.0.attention.qkv_linear.wq.weight"] == (1.0, 0.1, 1e-9)


# ---------------------------------------------------------------- each library's own code (slow: imports them)


@pytest.mark.slow
def test_torchtitan_config_gives_each_parameter_its_groups(handoff):
    """torchtitan's ConfigManager loads the file; its OptimizersContainer (as configured: fused AdamW)
    on its llama3 model built from the file; names mapped with torchtitan's own HF adapter."""
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.config.manager import ConfigManager

    d, res = handoff
    path = res.files["torchtitan"]
    sys.path.insert(0, str(path.parent))
    try:
        config = ConfigManager().parse_args(["--module", path.stem, "--config", "hpt_handoff"])
    finally:
        sys.path.remove(str(path.parent))
        sys.modules.pop(path.stem, None)
    assert config.checkpoint.initial_load_path == str(d / "model") and config.checkpoint.initial_load_in_hf
    assert config.training.max_norm == OPTIMIZER["grad_clip"] and config.training.steps == 10
    model = config.model_spec.model.build()
    container = OptimizersContainer(config.optimizer, model_parts=[model])
    got = {n: (g["lr"], g["weight_decay"], g["eps"]) for o in container for g in o.param_groups for n in g["param_names"]}
    adapter = config.model_spec.state_dict_adapter(config.model_spec.model, None)
    want = {}
    for hf_name, v in expected(tiny_llama()).items():
        key = re.sub(r"\d+", "{}", hf_name, count=1)
        tt = adapter.from_hf_map[key].format(*re.findall(r"\d+", hf_name)[:1])
        want[re.sub(r"qkv_linear\.w[qkv]\.", "qkv_linear.wqkv.", tt)] = v  # torchtitan's fused QKV parameter
    assert_same(got, want)
    assert len({v[2] for v in got.values()}) == 2  # per-group ε reached torchtitan's AdamW
    # The schedule: transformers' after warmup, one step ahead during it.
    lam = config.lr_scheduler.build(optimizers=container, training_steps=10).schedulers[0].lr_lambdas[0]
    spec = OptimizerSpec.model_validate(OPTIMIZER)
    assert [lam(t) for t in range(2)] == [0.5, 1.0] and [spec.lr_factor(t) for t in range(2)] == [0.0, 0.5]
    assert [lam(t) for t in range(2, 10)] == pytest.approx([spec.lr_factor(t) for t in range(2, 10)], rel=1e-12)


@pytest.mark.slow
def test_checks_fail_on_a_wrong_group(handoff):
    """The writer's torchtitan and Megatron checks raise when one parameter's value is off."""
    from hptransfer.handoff.to_megatron import _megatron_model, check_megatron, megatron_groups
    from hptransfer.handoff.to_torchtitan import check_torchtitan, torchtitan_values

    d, res = handoff
    spec = OptimizerSpec.model_validate(OPTIMIZER)
    tt, _ = torchtitan_values(expected(tiny_llama()))
    check_torchtitan(res.files["torchtitan"], tt, spec)
    with pytest.raises(RuntimeError, match=r"lm_head\.weight"):
        check_torchtitan(res.files["torchtitan"], {**tt, "lm_head.weight": (0.02 * 0.125, 0.8, 1e-8)}, spec)  # ε dropped
    with megatron_groups():
        model = _megatron_model(tiny_llama().config)
        text = res.files["megatron"].read_text()
        assert "'output_layer.weight',), 0.0025, 0.8, 8e-08" in text
        want = _megatron_want(model)
        check_megatron(res.files["megatron"], want, spec, model)
        bad = {**want, "decoder.layers.1.mlp.linear_fc2.weight": (0.02, 0.4, 1e-8)}  # lr_mult dropped
        with pytest.raises(RuntimeError, match="linear_fc2"):
            check_megatron(res.files["megatron"], bad, spec, model)


def _megatron_want(model) -> dict[str, tuple[float, float, float]]:
    """Megatron GPTModel names → optimizer.json's values, from the HF names each one holds."""
    hf = expected(tiny_llama())
    kinds = {
        "embedding.word_embeddings.weight": "model.embed_tokens.weight",
        "output_layer.weight": "lm_head.weight",
        "decoder.final_layernorm.weight": "model.norm.weight",
        "self_attention.linear_qkv.weight": "self_attn.q_proj.weight",
        "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
        "mlp.linear_fc1.weight": "mlp.gate_proj.weight",
        "mlp.linear_fc2.weight": "mlp.down_proj.weight",
        "input_layernorm.weight": "input_layernorm.weight",
        "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    }
    out = {}
    for n, _ in model.named_parameters():
        m = re.match(r"decoder\.layers\.(\d+)\.(.*)", n)
        out[n] = hf[f"model.layers.{m.group(1)}.{kinds[m.group(2)]}"] if m else hf[kinds[n]]
    return out


@pytest.mark.slow
def test_torchtitan_model_from_the_handoff_reproduces_hf_logits(handoff):
    """The file's llama3 model spec, loaded from DIR/model through torchtitan's own HF adapter,
    computes the HF model's logits (dimensions, RoPE, norm ε and the name mapping all right)."""
    from safetensors.torch import load_file
    from torchtitan.config.manager import ConfigManager
    from transformers import AutoModelForCausalLM

    d, res = handoff
    path = res.files["torchtitan"]
    sys.path.insert(0, str(path.parent))
    try:
        config = ConfigManager().parse_args(["--module", path.stem, "--config", "hpt_handoff"])
    finally:
        sys.path.remove(str(path.parent))
        sys.modules.pop(path.stem, None)
    mc = config.model_spec.model
    model = mc.build()
    adapter = config.model_spec.state_dict_adapter(mc, str(d / "model"))
    model.load_state_dict(adapter.from_hf(load_file(d / "model" / "model.safetensors")), strict=True)
    x = torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(SEQ).repeat(2, 1)
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(d / "model").eval()(x).logits
        out = model(x, positions=pos, attention_masks=model.get_attention_masks(pos))
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


def _batches() -> torch.Tensor:
    return torch.randint(0, 256, (STEPS, BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))


def plain_loop(model_dir: Path, opt: dict, batches: torch.Tensor) -> list[float]:
    """The reference: torch AdamW with the groups, transformers' schedule, clipping, mean token CE."""
    from transformers import AutoModelForCausalLM, get_cosine_with_min_lr_schedule_with_warmup

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    want = expected(model, opt)
    groups = [
        {"params": [p], "lr": want[n][0], "weight_decay": want[n][1], "eps": want[n][2]} for n, p in model.named_parameters()
    ]
    optim = torch.optim.AdamW(groups, betas=tuple(opt["betas"]))
    s = opt["schedule"]
    sched = get_cosine_with_min_lr_schedule_with_warmup(optim, s["warmup_steps"], s["total_steps"], min_lr_rate=s["min_lr_rate"])
    losses = []
    for b in batches:
        logits = model(input_ids=b[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
        optim.step()
        sched.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_hf_trainer_from_the_handoff_matches_a_plain_loop(handoff, tmp_path):
    """A real transformers.Trainer built by DIR/trainers/hf_trainer.py, on fixed batches in order,
    matches a plain AdamW loop within 1e-4 at every step; the loop without multipliers does not."""
    d, res = handoff
    batches = _batches()

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return STEPS * BATCH

        def __getitem__(self, i):
            seq = batches[i // BATCH, i % BATCH]
            return {"input_ids": seq[:-1], "labels": seq[1:]}

    sys.path.insert(0, str(res.files["hf_trainer"].parent))
    try:
        import hf_trainer

        tr = hf_trainer.trainer(
            Rows(),
            handoff=d,
            trainer_cls=hf_trainer.HandoffTrainer,
            output_dir=str(tmp_path / "out"),
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            logging_steps=1,
            use_cpu=True,
        )
        tr.train()
    finally:
        sys.path.remove(str(res.files["hf_trainer"].parent))
        sys.modules.pop("hf_trainer", None)
    assert tr.args.max_grad_norm == OPTIMIZER["grad_clip"]
    ref = plain_loop(d / "model", OPTIMIZER, batches)
    assert len(tr.step_losses) == STEPS
    assert tr.step_losses == pytest.approx(ref, rel=1e-4)
    ones = {
        **OPTIMIZER,
        "param_groups": [{**g, "lr_mult": 1.0, "wd_mult": 1.0, "eps_mult": 1.0} for g in OPTIMIZER["param_groups"]],
    }
    sp = plain_loop(d / "model", ones, batches)
    assert max(abs(a - b) / b for a, b in zip(tr.step_losses, sp)) > 1e-3


DS_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from deepspeed_train import initialize
engine, optimizer, _, sched = initialize()
names = {id(p): n for n, p in engine.module.named_parameters()}
groups = {names[id(p)]: [g["initial_lr"], g["weight_decay"], g["eps"]] for g in optimizer.param_groups for p in g["params"]}
b = __import__("torch").randint(0, 256, (1, 9))
loss = __import__("torch").nn.functional.cross_entropy(engine(b[:, :-1]).logits.flatten(0, 1), b[:, 1:].flatten())
engine.backward(loss); engine.step()
print("GROUPS" + json.dumps({"groups": groups, "clip": engine.gradient_clipping(), "lr1": sched.get_last_lr()}))
"""


@pytest.mark.slow
def test_deepspeed_engine_keeps_the_client_optimizer_groups(handoff):
    """deepspeed.initialize (one process, CPU/gloo) with the file's client optimizer: the engine's
    optimizer carries every parameter's lr / wd / ε and one engine step runs."""
    from deepspeed.runtime.config import DeepSpeedConfig

    d, res = handoff
    DeepSpeedConfig(json.loads(res.files["deepspeed_config"].read_text()))
    from hptransfer.env import configure

    configure()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    out = subprocess.run(
        [sys.executable, "-c", DS_SCRIPT, str(res.files["deepspeed"].parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.split("GROUPS", 1)[1])
    assert_same(got["groups"], expected(tiny_llama()))
    assert got["clip"] == OPTIMIZER["grad_clip"]
    spec = OptimizerSpec.model_validate(OPTIMIZER)
    assert sorted(set(got["lr1"])) == pytest.approx(sorted({v[0] * spec.lr_factor(1) for v in expected(tiny_llama()).values()}))


@pytest.mark.slow
def test_files_are_written_unchecked_without_torchtitan_and_megatron(handoff, tmp_path):
    """A user without torchtitan or Megatron-core still gets both files, and a note that they were not
    checked; the files are the ones a user with both libraries gets (checked there), byte for byte."""
    d, checked = handoff
    tiny_llama().save_pretrained(tmp_path / "model")
    script = f"""
import json, sys
sys.modules["torchtitan"] = None; sys.modules["megatron"] = None  # not installed
from hptransfer.handoff.trainers import write_trainer_files
res = write_trainer_files({str(tmp_path / "trainers")!r}, {str(tmp_path / "model")!r}, json.loads({json.dumps(json.dumps(OPTIMIZER))}))
print("NOTES" + json.dumps(res.notes))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    notes = json.loads(out.stdout.split("NOTES", 1)[1])
    assert sum(n.startswith("torchtitan: not installed") and "NOT checked" in n for n in notes) == 1, notes
    assert sum(n.startswith("Megatron-core: not installed") and "NOT checked" in n for n in notes) == 1, notes
    assert not any("NOT checked" in n for n in checked.notes), checked.notes  # with the libraries: checked
    for rel in ("torchtitan/hpt_handoff_config.py", "megatron/param_group_overrides.py"):
        text = (tmp_path / "trainers" / rel).read_text()
        assert text == (d / "trainers" / rel).read_text().replace(str(d), str(tmp_path)), rel
        compile(text, rel, "exec")
    assert (tmp_path / "trainers/torchtitan/hpt_handoff_config.py").read_text().count(repr(OPTIMIZER["lr"])) >= 1


@pytest.mark.slow
def test_a_query_scaled_apart_unfuses_torchtitan_and_is_refused_by_megatrons_fused_qkv(handoff, tmp_path):
    """attn_scale 1/d folded into q_proj gives q its own multipliers: torchtitan gets unfused wq/wk/wv
    (checked), Megatron's fused linear_qkv cannot hold it, so its globs stay on HF names (checked there)."""
    from hptransfer.handoff.trainers import write_trainer_files

    d, _ = handoff
    q = {"pattern": L + r"self_attn\.q_proj\.weight", "lr_mult": 0.5, "wd_mult": 2.0, "eps_mult": 0.5}
    opt = {**OPTIMIZER, "param_groups": [q, *OPTIMIZER["param_groups"]]}
    res = write_trainer_files(tmp_path / "trainers", d / "model", opt)
    text = res.files["torchtitan"].read_text()
    assert "'fuse_qkv': False" in text and r"qkv_linear\\.wq\\.weight$', 0.01, 0.2, 5e-09" in text
    assert any("unfused wq/wk/wv" in n for n in res.notes)
    assert any("linear_qkv" in n and "cannot express" in n for n in res.notes)
    assert "model.layers.*.self_attn.q_proj.weight" in res.files["megatron"].read_text()


@pytest.mark.slow
def test_a_trainer_file_whose_optimizer_breaks_the_adamw_semantics_is_refused(handoff, tmp_path):
    """Each written file's check probes the optimizer its trainer builds from it (handoff/semantics.py):
    the file as written passes; edited to the variant a user might reach for — torch.optim.Adam
    (L2 decay) in the torch files, torchtitan's "Adam", Megatron's decoupled_weight_decay False —
    the check raises naming weight_decay, with the groups themselves unchanged."""
    from hptransfer.handoff.to_megatron import _megatron_model, check_megatron, megatron_groups
    from hptransfer.handoff.to_torch import _check_torch_file
    from hptransfer.handoff.to_torchtitan import check_torchtitan, torchtitan_values

    d, res = handoff
    spec = OptimizerSpec.model_validate(OPTIMIZER)
    assert spec.adamw.weight_decay == "decoupled-times-group-lr"

    def edited(path: Path, old: str, new: str) -> Path:
        text = path.read_text()
        assert text.count(old) == 1, (path.name, old)
        out = tmp_path / path.parent.name / path.name
        out.parent.mkdir(exist_ok=True)
        out.write_text(text.replace(old, new))
        return out

    want = expected(tiny_llama())
    for f in (res.files["hf_trainer"], res.files["deepspeed"]):
        _check_torch_file(f, want, spec, d / "model")
        with pytest.raises(RuntimeError, match="weight_decay: the trainer's optimizer has 'l2-in-gradient'"):
            _check_torch_file(edited(f, "return torch.optim.AdamW(", "return torch.optim.Adam("), want, spec, d / "model")
    tt, _ = torchtitan_values(want)
    with pytest.raises(RuntimeError, match="torchtitan.*weight_decay: the trainer's optimizer has 'l2-in-gradient'"):
        check_torchtitan(edited(res.files["torchtitan"], 'optimizer_name="AdamW"', 'optimizer_name="Adam"'), tt, spec)
    with megatron_groups():
        model = _megatron_model(tiny_llama().config)
        mg = _megatron_want(model)
        check_megatron(res.files["megatron"], mg, spec, model)
        broken = edited(res.files["megatron"], "decoupled_weight_decay=True", "decoupled_weight_decay=False")
        with pytest.raises(RuntimeError, match="Megatron-core.*weight_decay: the trainer's optimizer has 'l2-in-gradient'"):
            check_megatron(broken, mg, spec, model)
