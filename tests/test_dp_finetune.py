"""The fine-tuning regime (dp.init_from: pretrain, dp/finetune.py): the spec's rules, the private
part's derived spec, and `hpt run` end to end — pretrain on the stdlib, then DP-fine-tune on the
installed packages' READMEs from the large run's own handoff, ε reported and ≤ target."""

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from hptransfer.dp.finetune import private_spec, sweep_settings
from hptransfer.errors import SpecError
from hptransfer.plan import load_plan
from hptransfer.spec import load_spec, parse_spec

from conftest import e2e_spec_dict

# Tiny: N = 256 private sequences, one epoch, 2 batch sizes × 1 C × 1 lr × 1 seed per width.
DP = {
    "init_from": "pretrain",
    "data": {"corpus": "prose", "max_files": 40, "eval_batches": 2},
    "epsilon": 8.0,
    "delta": 1e-4,
    "dataset_size": 256,
    "epochs": 1,
    "batch_sizes": [32, 64],
    "min_steps": 1,
    "clip_factors": [1.0],
    "accountant": "rdp",
    "epsilon_tolerance": 0.2,
    "sweep": {"widths": [32, 64], "epsilons": [8.0], "lrs": [0.01], "seeds": [0]},
}


def finetune_spec_dict(**dp) -> dict:
    """The shared e2e study (conftest) plus a fine-tuning `dp:` block: its pretraining is that study's."""
    return {**e2e_spec_dict(), "dp": {**DP, **dp}}


def test_the_shipped_spec_is_the_fine_tuning_regime():
    spec = load_spec("search_spaces/dp-finetune.yaml")
    assert spec.dp.finetunes_pretrained and spec.transfer.rule != "dp"
    assert spec.data.corpus == "stdlib" and spec.dp.data.corpus == "prose"
    s = sweep_settings(spec)
    assert len(s.widths) >= 2 and s.widths[-1] == spec.target.width and float("inf") in s.epsilons


def test_private_spec_reads_the_private_corpus_with_rule_dp_from_the_handoff(tmp_path):
    spec = parse_spec(finetune_spec_dict())
    p = private_spec(spec, tmp_path / "hf_model")
    assert p.data.corpus == "prose" and p.data.max_files == 40
    assert p.transfer.rule == "dp" and p.dp.init_from == str(tmp_path / "hf_model")
    assert not p.dp.finetunes_pretrained and p.dp.data is None
    assert (p.model, p.sweep, p.target, p.dp.epsilon) == (spec.model, spec.sweep, spec.target, spec.dp.epsilon)
    # Defaults: the target's width, ε and the noise-free arm, dp.lr or 3e-3, the sweep's seeds.
    s = sweep_settings(parse_spec(finetune_spec_dict(sweep={})))
    assert (s.widths, s.epsilons, s.lrs, s.seeds) == ([64], [8.0, float("inf")], [0.003], [0])


@pytest.mark.parametrize(
    "over, text",
    [
        ({"transfer": {"rule": "dp"}}, "transfer.rule is the pretraining ladder's rule"),
        ({"model": {"family": "mlp", "depth": 1, "head_dim": 16, "seq_len": 16}}, "needs a model with a Hugging Face form"),
        ({"dp": {**DP, "sweep": {"widths": [32, 128]}}}, "exceed target.width=64"),
        ({"dp": {**DP, "init_from": None}}, "dp.data, dp.sweep and dp.tuning_data apply to the fine-tuning regime"),
        ({"dp": {**DP, "sweep": {"epsilons": [0]}}}, "each ε must be > 0"),
    ],
)
def test_bad_fine_tuning_specs_name_the_field_and_fix(over, text):
    with pytest.raises(SpecError, match=text):
        parse_spec({**finetune_spec_dict(), **over})


def test_hpt_dp_sweep_on_a_pretrain_spec_says_to_use_hpt_run(tmp_path):
    from hptransfer.context import StudyContext
    from hptransfer.dp.sweep import run_dp_sweep
    from hptransfer.errors import DPError

    with pytest.raises(DPError, match="run inside `hpt run SPEC`"):
        run_dp_sweep(StudyContext.from_spec(finetune_spec_dict(), tmp_path))


@pytest.mark.slow
def test_hpt_run_pretrains_then_fine_tunes_privately_from_its_own_handoff(hpt_run_study, tmp_path):
    """The session's e2e study is the pretraining (sweep → plan → large run, reused: a re-run keeps
    it); the same `hpt --verbose run` with the dp block then runs the DP sweeps at widths 32 (a model pretrained
    there by the pretraining plan) and 64 (the large run's handoff), the across-width check, the
    private plan and the private large run."""
    study = tmp_path / "study"
    shutil.copytree(hpt_run_study["dir"], study)
    before = (study / "sweep_results.csv").read_bytes()
    spec = tmp_path / "ft.yaml"
    spec.write_text(yaml.safe_dump(finetune_spec_dict()))
    r = subprocess.run(
        [sys.executable, "-m", "hptransfer", "--verbose", "run", str(spec), "--study-dir", str(study), "--skip-coord-check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    assert (study / "sweep_results.csv").read_bytes() == before  # the pretraining sweep resumed, not redone
    assert "large run: already finished for this plan" in r.stdout  # the pretraining run kept, not relaunched
    # --verbose: the private run's Ray Train workers' output on the console, as plain text
    console = r.stdout + r.stderr
    for noise in ("TrainingReport(", "(RayTrainWorker pid="):
        assert noise in console, f"{noise!r} not on the console under --verbose:\n{console[-3000:]}"
    assert "\x1b[" not in console
    handoff = study / "train" / "hf_model"
    # The DP sweeps: every trial of a width starts from that width's pretrained model, within ε.
    best = {}
    for w in (32, 64):
        df = pd.read_csv(study / "private" / f"dp_sweep_w{w}" / "dp_sweep_results.csv")
        assert len(df) == 2 and (df.status == "ok").all() and (df.epsilon_spent <= 8.0 + 1e-9).all()
        assert df.initial_val_loss.nunique() == 1  # one starting model
        row = df.loc[df.val_loss.idxmin()]
        best[w] = (int(row["batch_size"]), float(row["clip"]), float(row["lr"]))
    assert (study / "private" / "pretrain_w32" / "hf_model" / "config.json").is_file()
    check = json.loads((study / "private" / "dp_across_width.json").read_text())
    assert (check["narrow_width"], check["wide_width"]) == (32, 64)
    # Two cells, one seed: the narrow width's cell holds when the wide width chose it too; otherwise one
    # seed gives no interval, so the check cannot say (never "holds" or "does not hold" on one seed).
    entry = check["per_epsilon"][0]
    for w in (32, 64):
        got = entry["best"][str(w)]
        assert (got["batch_size"], got["clip"], got["lr"]) == pytest.approx(best[w], rel=1e-12)
    assert entry["verdict"] == ("holds" if best[32] == best[64] else "inconclusive"), (best, entry)
    # The private plan: rule dp on the private corpus, the narrow width's settings, from the handoff.
    plan = load_plan(study / "private" / "transfer_plan.yaml")
    assert plan.rule == "dp" and plan.data.corpus == "prose" and plan.target.width == 64
    assert plan.dp["pretrained_from"] == str(handoff) and plan.dp["settings_from_width"] == 32
    assert plan.dp["across_width"]["wide_width"] == 64
    # The private large run: fine-tuned the handed-off model, spent at most ε, said so.
    final = json.loads((study / "private" / "train" / "train_metrics.json").read_text())["final"]
    assert final["status"] == "ok" and final["init_from"] == str(handoff)
    assert 0 < final["epsilon_spent"] <= final["target_epsilon"] == 8.0
    assert final["steps"] == plan.target.steps and final["batch_size"] == plan.target.batch_size
    assert "private final" in r.stdout and "ε spent" in r.stdout
    # dp.tuning: public (the default): every DP sweep read the public pretraining corpus, its norms too;
    # the ledger lists the one read of the private corpus, and its total is train_metrics' epsilon_total.
    for w in (32, 64):
        norms = json.loads((study / "private" / f"dp_sweep_w{w}" / "dp_grad_norms.json").read_text())
        assert norms["corpus"] == "stdlib" and len(norms["norms"]) > 0
    ledger = json.loads((study / "private" / "privacy_ledger.json").read_text())
    assert [(e["stage"], e["data"]) for e in ledger["entries"]] == [("private large run", "prose")]
    assert ledger["entries"][0]["epsilon"] == pytest.approx(final["epsilon_spent"], rel=1e-12)
    assert ledger["total"]["epsilon"] == pytest.approx(sum(e["epsilon"] for e in ledger["entries"]), rel=1e-12)
    assert final["epsilon_total"] == pytest.approx(ledger["total"]["epsilon"], rel=1e-12) and final["epsilon_total"] <= 8.0
    assert {s["data"] for s in ledger["public_stages"]} == {"stdlib"}
    assert "ε of the whole study" in r.stdout
    from mlflow import MlflowClient

    from hptransfer.layout import resolve_tracking_uri

    tracking = finetune_spec_dict().get("tracking") or {}
    client = MlflowClient(tracking_uri=resolve_tracking_uri(study, tracking.get("uri"), None))
    exps = [e.experiment_id for e in client.search_experiments()]
    (logged,) = client.search_runs(exps, filter_string="metrics.epsilon_total > 0")  # the private run's
    assert logged.data.metrics["epsilon_total"] == pytest.approx(ledger["total"]["epsilon"], rel=1e-12)
    assert logged.data.metrics["final_epsilon_spent"] == pytest.approx(final["epsilon_spent"], rel=1e-12)
    assert "privacy_ledger.json" in [a.path for a in client.list_artifacts(logged.info.run_id)]


# --- dp.tuning: public (issue 38, item 1) ------------------------------------------------------------


@pytest.mark.parametrize(
    "dp, text",
    [
        ({"data": None}, r"dp.tuning_data \(null: `data`\) is the private corpus \(stdlib; dp.data is null"),
        ({"tuning_data": DP["data"]}, r"dp.tuning_data is the private corpus \(prose, dp.data\)"),
    ],
)
def test_a_spec_that_would_tune_on_the_private_corpus_is_refused(dp, text):
    with pytest.raises(SpecError, match=text):
        parse_spec(finetune_spec_dict(**dp))
    # a different public proxy is fine
    parse_spec(finetune_spec_dict(tuning_data={"corpus": "stdlib", "max_files": 60}))


def test_the_dp_sweep_reads_the_public_corpus_and_runs_with_the_private_one_deleted(tmp_path):
    """Which corpus the tuning reads, by what it can open: the private corpus is a folder of text
    files, the DP sweep's data (its N sequences, the norm sequences after them, the validation batches)
    is loaded through dp/lm_task.py from `tuning_spec` with that folder deleted, and the private part's
    spec (`private_spec`, the private run's) cannot load without it. N is the private run's."""
    from hptransfer.dp.finetune import tuning_spec
    from hptransfer.dp.lm_task import load_lm_task, public_sequences
    from hptransfer.models import build_model
    from hptransfer.models.handoff import save_handoff

    private_dir = tmp_path / "private_text"
    private_dir.mkdir()
    for i in range(30):
        (private_dir / f"doc{i}.txt").write_text(f"private record {i}: " + "a confidential sentence. " * 40)
    files = {"corpus": "files", "paths": [str(private_dir / "*.txt")], "cache_dir": str(tmp_path / "cache"), "eval_batches": 2}
    spec = parse_spec(finetune_spec_dict(data=files))
    hf = tmp_path / "hf_model"
    save_handoff(
        build_model(spec.model, 32, base_width=spec.base_width, seed=0),
        hf,
        spec_model=spec.model,
        width=32,
        base_width=spec.base_width,
    )

    t = tuning_spec(spec, hf)
    assert t.data == spec.data and t.data.corpus == "stdlib" and t.dp.dataset_size == 256 and t.transfer.rule == "dp"
    shutil.rmtree(private_dir)
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    task = load_lm_task(t, 32)
    assert task.sequences.shape == (256, spec.model.seq_len + 1) and task.val
    norms_from = public_sequences(t)
    assert norms_from is not None and len(norms_from) > 0
    # The sequences are the public corpus's own (the stdlib's first 256), not a private record.
    assert b"private record" not in bytes(task.sequences.flatten().tolist())
    with pytest.raises(Exception, match="private_text|no file|match"):
        load_lm_task(private_spec(spec, hf), 32)


def test_the_ledger_composes_its_entries_and_names_the_private_corpus():
    """Basic composition (Dwork & Roth, Thm 3.16), written here: ε and δ add."""
    from hptransfer.dp.ledger import LedgerEntry, compose, finetune_ledger

    spec = parse_spec(finetune_spec_dict())
    final = {"epsilon_spent": 7.5, "delta": 1e-4, "accountant": "rdp", "sample_rate": 0.125, "steps": 8, "clip": 0.7,
             "noise_multiplier": 0.9, "dataset_size": 256}  # fmt: skip
    ledger = finetune_ledger(spec, final, spec.data)
    assert [(e.stage, e.data, e.epsilon, e.delta) for e in ledger.entries] == [("private large run", "prose", 7.5, 1e-4)]
    assert (ledger.total.epsilon, ledger.total.delta, ledger.budget_epsilon) == (7.5, 1e-4, 8.0)
    two = compose([*ledger.entries, LedgerEntry(stage="x", data="prose", mechanism="m", epsilon=0.25, delta=1e-6)])
    assert two.epsilon == pytest.approx(7.75, rel=1e-12) and two.delta == pytest.approx(1.01e-4, rel=1e-12)
    assert any("validation loss" in u for u in ledger.unaccounted)  # what ε does not cover, said


# --- dp.tuning: private (issue 38, item 2) -----------------------------------------------------------

# The private mode of the same tiny study: one width, 2 batch sizes × 2 LRs drawn by K ~ Geometric
# (E[K] = 2), the score on 256 validation sequences of the private corpus.
PRIVATE = {
    **{k: v for k, v in DP.items() if k != "sweep"},
    "tuning": "private",
    "sweep": {"widths": [64], "lrs": [0.003, 0.01], "seeds": [0]},
    "private_tuning": {"expected_trials": 2.0, "score_sequences": 256, "quantile_sequences": 128},
}


@pytest.mark.parametrize(
    "dp, text",
    [
        (
            {"tuning_data": {"corpus": "stdlib", "max_files": 60}},
            "dp.tuning_data is the public tuning corpus of dp.tuning: public",
        ),
        (
            {"sweep": {"widths": [64], "epsilons": [8.0]}},
            r"dp.sweep.epsilons=\[8.0\]: under dp.tuning: private .* no noise-free arm",
        ),
        ({"sweep": {"widths": [32, 64]}}, r"dp.sweep.widths=\[32, 64\]: dp.tuning: private tunes at one width"),
        ({"tuning": "public"}, "dp.private_tuning applies to dp.tuning: private"),
        ({"private_tuning": {"share": 1.0}}, "share"),
    ],
)
def test_private_tuning_specs_name_the_field_and_fix(dp, text):
    parse_spec({**finetune_spec_dict(), "dp": PRIVATE})  # the base is valid
    with pytest.raises(SpecError, match=text):
        parse_spec({**finetune_spec_dict(), "dp": {**PRIVATE, **dp}})


def test_the_private_tuning_ledger_composes_its_curves_by_rdp_with_opacus():
    """The total is Opacus' conversion of the summed RDP curves, computed here with Opacus directly."""
    import numpy as np
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    from hptransfer.dp import private_tuning as pt
    from hptransfer.dp.ledger import private_tuning_ledger
    from hptransfer.dp.tuning_run import Selection

    spec = parse_spec({**finetune_spec_dict(), "dp": PRIVATE})
    a = list(pt.ORDERS)
    quantile = 8 * pt.gaussian_rdp(1.0, 6.4)
    tuning = pt.tnb_rdp(pt.dp_sgd_rdp(0.125, 1.3, 8) + pt.gaussian_rdp(0.02, 0.05), 1.0, pt.gamma_for(2.0, 1.0))
    doc = {
        "mechanism": {
            "quantile": {"quantile": 0.5, "sequences": 128, "steps": 8, "count_noise_std": 6.4},
            "trials": {"law": "tnb", "trial_epsilon": 1.0, "score": {"clip": 5.5, "sequences": 256, "noise_std": 0.05}},
        },
        "rdp": {"quantile": quantile.tolist(), "tuning": tuning.tolist()},
    }
    final = {"sample_rate": 0.125, "steps": 8, "clip": 0.7, "noise_multiplier": 1.1, "dataset_size": 256}
    ledger = private_tuning_ledger(spec, final, Selection(32, 0.01, 0.7, 2.5, doc))
    assert [e.stage for e in ledger.entries] == ["DP quantile for C", "private tuning", "private large run"]
    assert {e.data for e in ledger.entries} == {"prose"}
    run = np.asarray(compute_rdp(q=0.125, noise_multiplier=1.1, steps=8, orders=a))
    want, _ = get_privacy_spent(orders=a, rdp=list(quantile + tuning + run), delta=1e-4)
    assert ledger.total.epsilon == pytest.approx(want, rel=1e-9) and ledger.total.delta == 1e-4
    assert ledger.total.epsilon < sum(e.epsilon for e in ledger.entries)  # RDP composition: tighter than adding ε
    assert ledger.orders == pytest.approx(a)


@pytest.mark.slow
def test_hpt_run_with_private_tuning_spends_at_most_the_budget_in_total_and_releases_only_the_selection(hpt_run_study, tmp_path):
    """dp.tuning: private end to end on the session's pretraining: the DP quantile, K DP trials on the
    private corpus, the selection, the private run on what is left; the ledger's total (the three
    composed by RDP) ≤ dp.epsilon; a re-run spends nothing again."""
    import numpy as np
    from opacus.accountants.analysis.rdp import get_privacy_spent

    study = tmp_path / "study"
    shutil.copytree(hpt_run_study["dir"], study)
    spec = tmp_path / "ft.yaml"
    spec.write_text(yaml.safe_dump({**finetune_spec_dict(), "dp": PRIVATE}))
    cmd = [sys.executable, "-m", "hptransfer", "run", str(spec), "--study-dir", str(study), "--skip-coord-check"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    assert "on the PRIVATE corpus 'prose'" in r.stdout and "private tuning: selected" in r.stdout
    assert "trial 1" not in r.stdout + r.stderr  # no line per trial: their count K is not released
    priv = study / "private"
    sel = json.loads((priv / "tuning" / "selection.json").read_text())
    assert not (priv / "tuning" / "state.json").exists()  # the other trials' scores are gone
    assert not list(priv.rglob("dp_grad_norms.json")) and not list(priv.glob("dp_sweep_w*"))  # no norms, no sweep table
    assert (sel["batch_size"], sel["lr"]) in {(b, lr) for b in (32, 64) for lr in (0.003, 0.01)}
    assert 1e-3 < sel["clip"] < 1e3
    plan = load_plan(priv / "transfer_plan.yaml")
    assert (plan.target.batch_size, plan.dp["clip"]) == (sel["batch_size"], pytest.approx(sel["clip"], rel=1e-12))
    assert plan.hps.lr == pytest.approx(sel["lr"], rel=1e-12) and plan.dp["private_tuning"]["budget_epsilon"] == 8.0
    final = json.loads((priv / "train" / "train_metrics.json").read_text())["final"]
    assert final["status"] == "ok" and final["noise_multiplier"] == pytest.approx(plan.dp["noise_multiplier"], rel=1e-12)
    ledger = json.loads((priv / "privacy_ledger.json").read_text())
    assert [e["stage"] for e in ledger["entries"]] == ["DP quantile for C", "private tuning", "private large run"]
    assert {e["data"] for e in ledger["entries"]} == {"prose"}
    assert ledger["entries"][2]["epsilon"] == pytest.approx(final["epsilon_spent"], rel=1e-6)
    curve = np.sum([e["rdp"] for e in ledger["entries"]], axis=0)
    total, _ = get_privacy_spent(orders=ledger["orders"], rdp=list(curve), delta=1e-4)
    assert ledger["total"]["epsilon"] == pytest.approx(total, rel=1e-9)
    assert 0.95 * 8.0 < ledger["total"]["epsilon"] <= 8.0  # the budget used, never exceeded
    assert final["epsilon_total"] == pytest.approx(ledger["total"]["epsilon"], rel=1e-12)
    assert "the private tuning included" in r.stdout
    # Run again (in this process: what `hpt run` calls), the tuning reuses its selection and spends nothing
    # again; under other settings it refuses rather than tune a second time on the same data.
    from hptransfer.dp import finetune as ft
    from hptransfer.dp.tuning_run import run_private_tuning
    from hptransfer.errors import DPError

    fspec = parse_spec({**finetune_spec_dict(), "dp": PRIVATE})
    tspec = ft.private_spec(fspec, study / "train" / "hf_model")
    logs: list[str] = []
    again = run_private_tuning(priv / "tuning", tspec, fspec.dp.private_tuning, [0.003, 0.01], 64, log=logs.append)
    assert (again.batch_size, again.lr, again.clip) == (sel["batch_size"], sel["lr"], sel["clip"])
    assert logs and "already done" in logs[0]
    other = fspec.dp.private_tuning.model_copy(update={"expected_trials": 3.0})
    with pytest.raises(DPError, match="already ran under other settings"):
        run_private_tuning(priv / "tuning", tspec, other, [0.003, 0.01], 64, log=logs.append)
