"""Classes the release cannot tell from absent (fedhype.synthesis.absent), and the counts --n draws."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedhype.errors import ValidationError
from fedhype.synthesis.absent import absent_note, count_noise_std, unclear_classes
from fedhype.synthesis.sample import class_labels, empty_classes_note

NAMES = ["bägs", "sneaker", "tshirt", "zebra"]
#: two clients' DP counts, floored at 0 as the release keeps them: zebra is noise at both, tshirt at client 0
COUNTS = [[48.0, 51.2, 0.0, 10.2], [0.0, 47.5, 52.1, 0.0]]


def test_a_pooled_count_within_three_noise_std_of_zero_is_named_with_its_noise():
    got = unclear_classes(COUNTS, 5.0, NAMES)  # pooled std 5 √2 = 7.07: threshold 21.2
    assert [(u.name, u.count, round(u.std, 2)) for u in got] == [("zebra", 10.2, 7.07)]
    assert got[0].describe("pooled DP count") == "zebra (pooled DP count 10.2 ± 7.1)"
    # one client's counts against one client's noise: client 0 lacks tshirt (and zebra, 10.2 ≤ 15)
    assert [u.name for u in unclear_classes(COUNTS, 5.0, NAMES, [0])] == ["tshirt", "zebra"]
    assert [u.name for u in unclear_classes(COUNTS, 3.0, NAMES, [0])] == ["tshirt"]  # 10.2 > 3 × 3
    # the threshold is in noise units: under 4× the noise only sneaker (98.7 > 3 × 20 √2 = 84.9) is told from 0
    assert [u.name for u in unclear_classes(COUNTS, 20.0, NAMES)] == ["bägs", "tshirt", "zebra"]
    # without DP (std 0) only a class no client holds is named
    assert [u.name for u in unclear_classes([[3, 1, 0, 0], [0, 2, 1, 0]], 0.0, NAMES)] == ["zebra"]


def test_the_warning_counts_the_samples_and_gives_the_flags_that_drop_them():
    u = unclear_classes(COUNTS, 5.0, NAMES)
    text = absent_note(u, [300, 300, 300, 300], label_weights=None, n_clients=2)
    assert text == ("class(es) the release cannot tell from absent: zebra (pooled DP count 10.2 ± 7.1), within 3 noise "
                    "std of 0: the clients may hold none of them (or only a few records), and their 300 samples may be the "
                    "model's noise rather than data; drop "
                    "them with `fedhype synthesize --n 900 --label-weights 1,1,1,0` (the same numbers of the other "
                    "classes), or in Python keep the other classes of the returned store (`store.subset(...)`)")
    # --n with weights: the other classes keep theirs
    text = absent_note(u, [50, 25, 25, 100], label_weights=[2, 1, 1, 4], n_clients=2)
    assert "their 100 samples" in text and "--n 100 --label-weights 2,1,1,0" in text
    assert absent_note(u, [5, 5, 5, 0], label_weights=[1, 1, 1, 0], n_clients=2) is None  # none drawn: nothing to say
    exact = unclear_classes([[3, 1, 0, 0], [0, 2, 1, 0]], 0.0, NAMES)
    assert "zebra (no record): no client holds them" in absent_note(exact, [1, 1, 1, 1], label_weights=None, n_clients=2)


def test_when_most_classes_are_unclear_the_warning_says_the_counts_are_too_noisy_and_does_not_advise_dropping():
    """A probe's small consortium (81 records per class, ε = 1, 3 sites) had three of four classes flagged and was
    told to keep one (``--label-weights 0,0,0,1``): at that noise the counts cannot tell which classes are held."""
    u = unclear_classes(COUNTS, 20.0, NAMES)  # three of four classes within 3 std of 0
    text = absent_note(u, [300] * 4, label_weights=None, n_clients=2)
    assert text.startswith("3 of 4 classes have DP counts the release cannot tell from absent")
    assert "--label-weights" not in text and "dropping classes does not help" in text
    half = [x for x in u if x.name != "bägs"]  # two of four: still most of them by the rule (half or more)
    assert "--label-weights" not in absent_note(half, [300] * 4, label_weights=None, n_clients=2)


def _config(tmp_path, **train):
    conf = {"train": {"epsilon": 4.0, **train}, "privacy_plan": {"class_stats_noise_multiplier": 1.0}}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    return tmp_path


def test_the_count_noise_is_the_statistics_steps_sigma_over_the_count_weight(tmp_path):
    from fedhype.models.config import ModelConfig

    linear = ModelConfig(dim=8, n_classes=2)  # class bias and second moments: b² = 0.04
    assert linear.linear_path
    # uncentred: σ₀ / b = 1 / 0.2
    assert count_noise_std(_config(tmp_path, centre_share=0.0), linear) == pytest.approx(5.0)
    # centred (s = 0.06): the statistics step has σ₀ / √(1 − s)
    assert count_noise_std(_config(tmp_path, centre_share=0.06), linear) == pytest.approx(5.0 / math.sqrt(0.94))
    assert count_noise_std(_config(tmp_path, no_dp=True, epsilon=None), linear) == 0.0
    assert count_noise_std(_config(tmp_path, secure_aggregation=True), linear) is None  # the server saw the sum only
    assert count_noise_std(_config(tmp_path), ModelConfig(dim=8, n_classes=2, class_bias=False)) is None  # no release
    assert count_noise_std(tmp_path / "nowhere", linear) is None
    # the release's steps as the run recorded them (privacy_plan.prefix) come first: its last is the statistics step
    conf = json.loads((_config(tmp_path, centre_share=0.06)).joinpath("config.json").read_text())
    conf["privacy_plan"]["prefix"] = [[4.0, 1.0, 1], [1.5, 1.0, 1]]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    assert count_noise_std(tmp_path, linear) == pytest.approx(1.5 / 0.2)


def test_n_below_the_number_of_classes_is_refused_and_a_class_rounded_to_none_is_named():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValidationError, match=r"--n 3 is fewer than the 4 classes: --n is the total number of synthetic "
                                              r"embeddings, split between the classes \(evenly\), so 1 class\(es\) would "
                                              r"get none; give --n 4 or more, --per-class N"):
        class_labels(4, n=3, generator=gen)
    with pytest.raises(ValidationError, match="fewer than the 3 classes with a positive --label-weights"):
        class_labels(4, n=2, label_weights=[1, 1, 1, 0], generator=gen)
    assert torch.bincount(class_labels(4, n=3, label_weights=[1, 1, 1, 0], generator=gen), minlength=4).tolist() == [1, 1, 1, 0]
    counts = torch.bincount(class_labels(4, n=10, label_weights=[100, 1, 1, 1], generator=gen), minlength=4).tolist()
    assert counts == [10, 0, 0, 0]
    assert empty_classes_note(counts, [100, 1, 1, 1], NAMES, 10) == (
        "class(es) sneaker, tshirt, zebra got no sample: --n 10 split by --label-weights rounds their share below one; "
        "give a larger --n, or --per-class N for N of every class")
    assert empty_classes_note([1, 1, 1, 0], [1, 1, 1, 0], NAMES, 3) is None  # weight 0: left out as asked
    for bad in ([1, 1, 1, float("nan")], [1, 1, 1, float("inf")], [1e308, 1e308, 1, 1]):  # a helper: internal errors
        with pytest.raises(ValidationError, match="--label-weights needs 4 finite non-negative numbers"):
            class_labels(4, n=10, label_weights=bad, generator=gen)
    assert empty_classes_note([5, 5, 5, 5], None, NAMES, None) is None


def test_label_weights_of_the_wrong_length_name_the_classes_and_what_was_given():
    """A probe's `--label-weights 1,1` on a 4-class run got "needs 4 non-negative numbers", naming neither the
    2 given nor the classes' order."""
    import torch

    from fedhype.errors import ValidationError
    from fedhype.synthesis.sample import class_labels

    with pytest.raises(ValidationError) as err:
        class_labels(4, n=10, label_weights=[1, 1], generator=torch.Generator().manual_seed(0),
                     class_names=["c0", "c1", "c2", "c3"])
    assert "one per class (c0, c1, c2, c3, in that order); got 2: 1, 1" in str(err.value)
    with pytest.raises(ValidationError, match=r"\(k0, k1, .*k19, …, in that order\); got 1: -1"):
        class_labels(30, n=10, label_weights=[-1], generator=torch.Generator().manual_seed(0),
                     class_names=[f"k{i}" for i in range(30)])
