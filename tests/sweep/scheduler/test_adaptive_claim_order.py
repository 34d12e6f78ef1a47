"""Released adaptive seeds are claimed lowest seed first across cells, so every cell reaches its
first look before any cell runs its later batches (the study enqueues cell by cell)."""

from __future__ import annotations

import optuna

from harness.sweep.scheduler.adaptive import claim_order
from harness.sweep.stores.optuna_adapter import claim_waiting_trial


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for cell in ("a", "b", "c"):  # cell-major, as the grid enqueues
        for seed in range(4):
            study.enqueue_trial({}, user_attrs={"cell": cell, "seed": seed})
    return study


def _claim_all(study: optuna.Study, **kw: object) -> list[tuple[str, int]]:
    out = []
    while (t := claim_waiting_trial(study, **kw)) is not None:  # type: ignore[arg-type]
        ua = study._storage.get_trial(t._trial_id).user_attrs
        out.append((ua["cell"], ua["seed"]))
    return out


def test_adaptive_claims_go_seed_by_seed_across_cells() -> None:
    got = _claim_all(_study(), order=claim_order)
    assert got == [(c, s) for s in range(4) for c in ("a", "b", "c")]


def test_without_an_order_claims_follow_the_enqueue_order() -> None:
    got = _claim_all(_study())
    assert got == [(c, s) for c in ("a", "b", "c") for s in range(4)]


def test_order_and_accept_combine() -> None:
    study = _study()
    got = _claim_all(
        study, order=claim_order, accept=lambda t: t.user_attrs["seed"] < 2
    )  # held seeds 2, 3 stay WAITING
    assert got == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert sorted((t.user_attrs["cell"], t.user_attrs["seed"]) for t in waiting) == [
        (c, s) for c in ("a", "b", "c") for s in (2, 3)
    ]


def test_a_seed_another_worker_runs_is_claimed_last() -> None:
    """Two workers that took the same seed of two cells at once would build (or wait on) that
    seed's warm start together while a core idles: a busy seed goes after the others."""
    from harness.sweep.scheduler.adaptive import claim_order_avoiding

    study = _study()
    first = claim_waiting_trial(study, order=claim_order_avoiding(set()))
    assert first is not None and study._storage.get_trial(first._trial_id).user_attrs == {
        "cell": "a",
        "seed": 0,
    }
    # Seed 0 runs elsewhere: the next worker takes seed 1, not b's seed 0.
    got = _claim_all(study, order=claim_order_avoiding({0}))
    assert got[:3] == [("a", 1), ("b", 1), ("c", 1)]
    assert got[-2:] == [("b", 0), ("c", 0)]  # still claimed, once nothing else is released
    assert len(got) == 11
    # Nothing busy: the plain lowest-seed-first order.
    assert _claim_all(_study(), order=claim_order_avoiding(set())) == _claim_all(
        _study(), order=claim_order
    )
