"""τ's bootstrap intervals over prompts (eval/load.py): a paired difference of two rows over the same prompts
cancels what the prompts share."""

import numpy as np
import pytest

from eyas.eval.load import bootstrap_interval, tau_difference_interval, tau_draws


def test_a_paired_difference_cancels_the_prompts_spread():
    """Prompts of very different difficulty (10 to 100 accepted drafts in 100 rounds), row b accepting 5
    more in each: every draw of the prompts gives b 0.05 over a, so the paired interval is that point, while
    each row's own interval spans the prompts' spread."""
    acc_a, rounds = [10, 40, 70, 100], [100, 100, 100, 100]
    acc_b = [x + 5 for x in acc_a]
    lo, hi = tau_difference_interval((acc_b, rounds), (acc_a, rounds))
    assert lo == pytest.approx(0.05) and hi == pytest.approx(0.05)
    a = np.array(acc_a, dtype=np.float64), np.array(rounds, dtype=np.float64)
    own_lo, own_hi = bootstrap_interval(lambda idx: tau_draws(*a, idx), len(acc_a))
    assert own_hi - own_lo > 0.3
    assert tau_difference_interval((acc_a, rounds), (acc_a, rounds)) == [0.0, 0.0]


def test_rows_over_other_prompts_are_refused_and_one_prompt_has_no_interval():
    with pytest.raises(ValueError, match="paired rows over 3 and 2 prompts"):
        tau_difference_interval(([1, 2, 3], [4, 4, 4]), ([1, 2], [4, 4]))
    assert tau_difference_interval(([3], [4]), ([1], [4])) is None
