"""LadderSearcher without Ray: what it hands out, when, and that its state survives a checkpoint."""

import pickle

from ray.tune.search import Searcher

from hptransfer.sweep.ladder import LadderSearcher, best_point


def _ladder():
    grid = [{"width": w, "seed": 0, "lr": lr} for w in (64, 32) for lr in (0.01, 0.1)]
    return LadderSearcher(grid, ["lr"], [1, 2], {64: 0, 32: 1})


def test_replicates_of_a_width_follow_its_grid_and_precede_narrower_widths():
    s = _ladder()
    a, b, c = s.suggest("a"), s.suggest("b"), s.suggest("c")  # both 64s, then the first 32
    assert [(p["width"], p["lr"], p["replicate"]) for p in (a, b, c)] == [(64, 0.01, False), (64, 0.1, False), (32, 0.01, False)]
    s.on_trial_complete("a", {"val_loss": 3.0, "status": "ok"})
    s.on_trial_complete("b", {"val_loss": 2.5, "status": "ok"})  # width 64's grid done: its replicates jump the queue
    d, e, f = s.suggest("d"), s.suggest("e"), s.suggest("f")
    assert [(p["width"], p["lr"], p["seed"], p["replicate"]) for p in (d, e, f)] == [
        (64, 0.1, 1, True),
        (64, 0.1, 2, True),
        (32, 0.1, 0, False),
    ]
    assert s.suggest("g") is None  # width 32's grid still running: its replicates are not known yet
    s.on_trial_complete("c", {"val_loss": 2.0, "status": "ok"})
    s.on_trial_complete("f", {"val_loss": 1.0, "status": "diverged"})  # not ok: its loss does not count
    assert [(p["width"], p["lr"]) for p in (s.suggest("h"), s.suggest("i"))] == [(32, 0.01), (32, 0.01)]
    for t in "dehi":
        assert s.suggest("x") is None
        s.on_trial_complete(t, {"val_loss": 2.0, "status": "ok"})
    assert s.suggest("z") == Searcher.FINISHED


def test_a_width_without_an_ok_trial_gets_no_replicates_and_a_replayed_completion_counts_once():
    s = _ladder()
    ids = [f"t{i}" for i in range(4)]
    points = [s.suggest(t) for t in ids]
    for t, p in zip(ids, points):
        s.on_trial_complete(t, None if p["width"] == 32 else {"val_loss": 1.0, "status": "ok"}, error=p["width"] == 32)
    s.on_trial_complete("t0", {"val_loss": 0.1, "status": "ok"})  # already counted: ignored
    assert [p["width"] for p in (s.suggest("r1"), s.suggest("r2"))] == [64, 64]
    assert s.suggest("r3") is None


def test_state_round_trips_through_tunes_checkpoint(tmp_path):
    s = _ladder()
    s.suggest("a")
    s.on_trial_complete("a", {"val_loss": 1.0, "status": "ok"})
    s.suggest("b")
    s.save(str(tmp_path / "state.pkl"))
    t = _ladder()
    t.restore(str(tmp_path / "state.pkl"))
    assert pickle.dumps(t.get_state()) == pickle.dumps(s.get_state())
    assert t.suggest("c") == s.suggest("c")


def test_best_point_is_the_lowest_seed_averaged_ok_loss():
    rows = [
        {"lr": 0.1, "val_loss": 1.0, "ok": True},
        {"lr": 0.1, "val_loss": 3.0, "ok": True},  # mean 2.0
        {"lr": 0.3, "val_loss": 1.5, "ok": True},
        {"lr": 0.01, "val_loss": 0.1, "ok": False},
    ]
    assert best_point(rows, ["lr"]) == {"lr": 0.3}
    assert best_point([{"lr": 0.1, "val_loss": 1.0, "ok": False}], ["lr"]) is None
