"""The hybrid's calibration (engines.vllm.calibrate): vLLM's n-gram rule replayed on answers, and
the shortest match length worth an n-gram row."""

from __future__ import annotations

import pytest

from engines.vllm.calibrate import choose_ngram_min, ngram_curve, ngram_proposals


def test_the_ngram_rule_is_vllms_longest_earliest_match_never_the_suffix_itself():
    #                 0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    got = ngram_proposals(tokens, start=4, n_max=3, k=3)
    # t=4: "4" never seen before → no match; t=5: "1" at 0 → drafts 2 3 4, all right;
    # t=8: "2 3 4" (capped at 3) at 1 → drafts 1 2 3, the answer ends after 1 2
    assert got == [(0, 0), (1, 3), (2, 3), (3, 3), (3, 2), (3, 1)]
    # the earliest occurrence is drafted from: after 7 7 the first 7 7 9 is proposed, not 7 7 8
    assert ngram_proposals([7, 7, 9, 7, 7, 8, 7, 7, 9], 8, 2, 1) == [(2, 1)]
    assert ngram_proposals([5, 6], 0, 3, 2) == [(0, 0), (0, 0)]


def test_the_curve_groups_positions_by_match_length():
    curve = ngram_curve([([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 4)], n_max=3, k=3)
    assert curve[0] == {"positions": 1, "share": round(1 / 6, 4), "accepted": 0.0}
    assert curve[3]["positions"] == 3 and curve[3]["accepted"] == pytest.approx(2.0)


def test_m_is_the_shortest_match_from_which_every_longer_one_beats_the_drafter():
    curve = {
        0: {"positions": 50, "share": 0.5, "accepted": 0.0},
        1: {"positions": 20, "share": 0.2, "accepted": 0.3},
        2: {"positions": 10, "share": 0.1, "accepted": 0.9},
        3: {"positions": 20, "share": 0.2, "accepted": 2.4},
    }
    # the drafter: 1 + 0.6 + 0.3 tokens for 1 + 0.1·2; an n-gram row: 1 + A for 1 + 0.1·3
    got = choose_ngram_min(curve, [0.6, 0.3, 0.1], d=2, k=3, c=0.1, n_max=6)
    assert got["drafter_value"] == pytest.approx(1.9 / 1.2, abs=1e-4)
    assert got["ngram_min"] == 3 and got["ngram_share"] == pytest.approx(0.2)
    # a weaker drafter lets 2-token matches in too
    assert choose_ngram_min(curve, [0.4, 0.1], d=2, k=3, c=0.1, n_max=6)["ngram_min"] == 2
    # a drafter no match beats: no n-gram rows (m past the longest match considered)
    assert choose_ngram_min(curve, [1.0, 1.0, 1.0], d=3, k=3, c=0.1, n_max=6)["ngram_min"] == 7
