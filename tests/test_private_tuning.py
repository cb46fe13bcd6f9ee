"""dp/private_tuning.py: Papernot & Steinke's bound checked against the exact Rényi divergence of a
tuning procedure, the truncated negative binomial, the DP quantile and the budget solvers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from hptransfer.dp import private_tuning as pt
from hptransfer.dp.accounting import noise_multiplier


def exact_best_of_geometric_rdp(s: float, gamma: float, lam: float) -> float:
    """D_λ(A(0) ‖ A(1)) for A = the largest of K ~ Geometric(γ) draws of the Gaussian mechanism
    x + N(0, s²) (sensitivity 1): max density γ f(y)/(1 − (1−γ)F(y))², the PGF's derivative at F."""

    def log_dens(y: float, mu: float) -> float:
        return math.log(gamma) + stats.norm.logpdf(y, mu, s) - 2 * math.log1p(-(1 - gamma) * stats.norm.cdf(y, mu, s))

    def integrand(y: float) -> float:
        return math.exp(lam * log_dens(y, 0.0) + (1 - lam) * log_dens(y, 1.0))

    val, _ = integrate.quad(integrand, -12 * s - 3, 12 * s + 4, limit=400)
    return math.log(val) / (lam - 1)


@pytest.mark.parametrize("s", [1.0, 2.0])
def test_the_tnb_bound_is_above_the_exact_divergence_of_best_of_k(s):
    eta, gamma = 1.0, pt.gamma_for(4.0, 1.0)  # geometric, E[K] = 4
    a = pt.orders()
    bound = pt.tnb_rdp(pt.gaussian_rdp(1.0, s, a), eta, gamma, a)
    one = pt.gaussian_rdp(1.0, s, a)
    for lam in (1.5, 4.0, 16.0):
        i = int(np.argmin(abs(a - lam)))
        exact = exact_best_of_geometric_rdp(s, gamma, float(a[i]))
        # best-of-K leaks about what one trial does (the check bounds something real) and the theorem covers it
        assert exact > 0.7 * one[i], (lam, exact, one[i])
        assert exact <= bound[i], (lam, exact, bound[i])


def test_expected_trials_and_the_sampler_agree_with_the_requested_mean():
    rng = np.random.default_rng(0)
    for eta in (0.0, 0.5, 1.0, 2.0):
        gamma = pt.gamma_for(4.0, eta)
        assert pt.expected_trials(eta, gamma) == pytest.approx(4.0, rel=1e-9)
        ks = np.array([pt.sample_trials(eta, gamma, rng) for _ in range(20000)])
        assert ks.min() >= 1
        # 20,000 draws: the mean's standard error is below 0.05 for these laws
        assert ks.mean() == pytest.approx(4.0, abs=0.2), eta
    with pytest.raises(ValueError, match="must exceed 1"):
        pt.gamma_for(1.0, 1.0)


def test_the_dp_quantile_finds_the_median_at_low_noise_and_its_noise_shows():
    rng = np.random.default_rng(1)
    norms = np.exp(rng.normal(0.0, 1.0, 1024))  # median 1
    est = pt.dp_quantile(norms, 0.5, 1e-3, 1e3, steps=12, noise=1.0, rng=rng)
    assert est == pytest.approx(float(np.median(norms)), rel=0.05)
    spread = [pt.dp_quantile(norms, 0.5, 1e-3, 1e3, steps=12, noise=300.0, rng=rng) for _ in range(40)]
    assert np.std(np.log(spread)) > 0.1  # a count noise of 30% of m moves the answer


def test_the_gaussian_and_dp_sgd_curves_are_opacus_own():
    from opacus.accountants import RDPAccountant

    assert list(pt.ORDERS) == list(RDPAccountant.DEFAULT_ALPHAS)
    acc = RDPAccountant()
    acc.history = [(1.1, 0.03, 40)]
    assert pt.epsilon_of(pt.dp_sgd_rdp(0.03, 1.1, 40), 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert pt.gaussian_rdp(0.5, 2.0)[0] == pytest.approx(1.1 * 0.25 / 8)


def _sigma(eps, q, t):
    return noise_multiplier(eps, 1e-5, q, t, "rdp")


def test_the_budget_spends_the_share_then_the_final_run_fills_the_rest_and_no_more():
    n = 1024
    cands = [(b, b / n, math.ceil(n / b)) for b in (16, 64)]  # two: the trial curve is their maximum
    quantile = 8 * pt.gaussian_rdp(1.0, 0.05 * n)
    score = pt.gaussian_rdp(math.log(256) / 2048, 0.05)
    tb = pt.tuning_budget(4.0, 1e-5, cands, _sigma, 4.0, 1.0, quantile, score)
    assert tb.epsilon <= 4.0 and tb.epsilon > 0.99 * 4.0 - 0.02
    assert len(tb.candidates) == 2 and all(c.sigma > 0 for c in tb.candidates)
    # the tuning costs more than one trial: Theorem 2's terms are positive
    assert pt.epsilon_of(tb.tuning_rdp, 1e-5) > pt.epsilon_of(tb.trial_rdp, 1e-5)
    eps_f, sigma_f, total = pt.final_epsilon(8.0, 1e-5, tb.rdp, 32 / n, 32, _sigma)
    assert total <= 8.0 and total > 0.99 * 8.0 - 0.04
    assert total == pytest.approx(pt.epsilon_of(tb.rdp + pt.dp_sgd_rdp(32 / n, sigma_f, 32), 1e-5), rel=1e-9)
    # RDP composition beats adding the ε's: the run gets more than the budget left by subtraction
    assert eps_f > 8.0 - tb.epsilon


def test_a_budget_the_score_alone_exhausts_is_refused_with_the_cause():
    n = 1024
    cands = [(32, 32 / n, 32)]
    score = pt.gaussian_rdp(math.log(256) / 64, 0.01)  # 64 validation sequences, tiny noise
    with pytest.raises(ValueError, match="scores alone spend"):
        pt.tuning_budget(1.0, 1e-5, cands, _sigma, 4.0, 1.0, np.zeros(len(pt.ORDERS)), score)
