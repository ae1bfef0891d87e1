"""Uplift / routing-quality measures on worked examples whose answers are computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from training.uplift import aiq, auc, auuc, bootstrap_se, ece, qini_coefficient, qini_curve


def test_qini_curve_and_auuc_by_hand():
    # tau = y_frontier - y_local for three units; the score ranks them 1st, 2nd, 3rd
    tau = np.array([1.0, 0.0, -1.0])
    best = np.array([3.0, 2.0, 1.0])
    # Q(0..3) = 0, 1, 1, 0 -> AUUC = (1 + 1 + 0) / 3^2 = 2/9
    assert qini_curve(best, tau).tolist() == [0.0, 1.0, 1.0, 0.0]
    assert auuc(best, tau) == pytest.approx(2 / 9)
    # perfect ranking: Qini coefficient 1; the reverse ranking: Q = 0, -1, -1, 0 -> -1
    assert qini_coefficient(best, tau) == pytest.approx(1.0)
    assert auuc(-best, tau) == pytest.approx(-2 / 9)
    assert qini_coefficient(-best, tau) == pytest.approx(-1.0)


def test_qini_ties_are_a_random_order_in_expectation():
    tau = np.array([1.0, 0.0, 0.0, 0.0])
    # all tied: the expected curve is the random line k/n * Q(n): coefficient 0
    assert qini_coefficient(np.zeros(4), tau) == pytest.approx(0.0)
    # perfect = sum cumsum([1,0,0,0]) = 4, random = (1+2+3+4)/4 = 2.5; scoring the first unit
    # alone on top reaches the perfect curve
    assert qini_coefficient(np.array([1.0, 0.0, 0.0, 0.0]), tau) == pytest.approx(1.0)
    # the uplift unit ranked second of four: Q = 0,0,1,1,1 -> A = 3; (3 - 2.5) / (4 - 2.5) = 1/3
    assert qini_coefficient(np.array([0.5, 1.0, 0.0, 0.0]) * [1, 1, 0.2, 0.1], tau) == pytest.approx(1 / 3)


def test_aiq_by_hand():
    # two runs: the first fails locally and succeeds on the frontier; the second succeeds on both
    yl, yf = np.array([0.0, 1.0]), np.array([1.0, 1.0])
    # escalation shares 0, 1/2, 1 -> quality 0.5, 1.0, 1.0 when the first run goes first;
    # trapezoid: 0.5 * (0.5 + 1) / 2 + 0.5 * (1 + 1) / 2 = 0.875
    assert aiq(np.array([1.0, 0.0]), yl, yf, points=3) == pytest.approx(0.875)
    # the other order: quality 0.5, 0.5, 1.0 -> 0.25 * 1.0 + 0.25 * 1.5 = 0.625
    assert aiq(np.array([0.0, 1.0]), yl, yf, points=3) == pytest.approx(0.625)
    # random mixing (a tie) is the straight line: mean of the endpoints 0.5 and 1.0
    assert aiq(np.zeros(2), yl, yf, points=3) == pytest.approx(0.75)


def test_auc_matches_mann_whitney_with_ties():
    y = np.array([1, 0, 1, 0])
    s = np.array([0.9, 0.9, 0.5, 0.1])
    # pairs (pos, neg): (0.9,0.9)=0.5 (0.9,0.1)=1 (0.5,0.9)=0 (0.5,0.1)=1 -> 2.5 / 4
    assert auc(y, s) == pytest.approx(0.625)
    assert np.isnan(auc(np.ones(3), np.arange(3.0)))


def test_ece_and_bootstrap_se():
    assert ece(np.array([1.0, 0.0]), np.array([0.5, 0.5])) == pytest.approx(0.0)
    assert ece(np.array([1.0, 1.0]), np.array([0.25, 0.25])) == pytest.approx(0.75)
    g = np.repeat(np.arange(20), 2)
    x = np.arange(40.0)
    se = bootstrap_se(lambda i: float(x[i].mean()), g, n_boot=200, seed=1)
    # SE of a mean of 20 group means (sd of group means ~ 11.5) ~ 11.5 / sqrt(20) ~ 2.6
    assert 1.5 < se < 3.8
