"""The paired statistics on inputs whose answer is known."""

from __future__ import annotations

import pytest

from kvmatrix.harness.judge.paired_stats import divergence, paired_delta


def test_a_large_consistent_drop_excludes_zero():
    baseline = [1.0] * 100
    cell = [1.0] * 60 + [0.0] * 40  # 40 of 100 samples lost, none gained
    result = paired_delta(baseline, cell)
    low, high = result["interval"]
    assert result["delta"] == pytest.approx(-0.4) and result["n"] == 100
    assert low < -0.4 < high < 0 and result["significant"]
    assert result["mcnemar_p"] < 1e-6  # 40 discordant pairs all one way


def test_balanced_changes_keep_zero_inside():
    baseline = [1.0] * 90 + [0.0] * 10
    cell = [1.0] * 87 + [0.0] * 3 + [1.0] * 3 + [0.0] * 7  # 3 lost, 3 gained
    result = paired_delta(baseline, cell)
    low, high = result["interval"]
    assert result["delta"] == 0 and low < 0 < high and not result["significant"]
    assert result["mcnemar_p"] == pytest.approx(1.0)


def test_a_small_drop_on_few_samples_is_not_significant():
    result = paired_delta([1.0] * 20, [1.0] * 19 + [0.0])
    assert result["interval"][1] >= 0 and not result["significant"]


def test_identical_scores_give_a_zero_width_interval():
    result = paired_delta([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert result["interval"] == [0.0, 0.0] and not result["significant"]


def test_the_interval_is_reproducible():
    baseline, cell = [1.0] * 50 + [0.0] * 50, [1.0] * 40 + [0.0] * 60
    assert paired_delta(baseline, cell) == paired_delta(baseline, cell)


def test_unpaired_inputs_are_rejected():
    with pytest.raises(ValueError, match="equal"):
        paired_delta([1.0, 0.0], [1.0])


def test_divergence_finds_the_first_differing_token_and_identical_share():
    baseline = [[1, 2, 3], [4, 5, 6], [7, 8], [9]]
    cell = [[1, 2, 3], [4, 0, 6], [7, 8, 0], [9]]
    assert divergence(baseline, cell) == {"sequences": 4, "identical_fraction": 0.5, "first_divergence": 1}
    assert divergence([[1]], [[1]])["first_divergence"] is None
