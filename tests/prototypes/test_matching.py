"""Gradient matching: the whole-vector cosine distance, closed-form head gradients, matching on real embeddings."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.prototypes import HyperPrototypeClassifier
from fedhype.prototypes.matching import (class_gradients, gradient_distance, head_gradients, match_prototypes,
                                         matching_distance)
from fedhype.prototypes.network import AdapterNet, init_parameters, orthogonal_anchors
from fedhype.prototypes.training import features_of


def test_whole_vector_cosine_differs_from_per_row():
    a = [torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 0.0])]
    b = [torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0.0, 1.0])]
    # rows are parallel → per-row distance 0 (and DC's form ignores the bias); the flattened weights
    # have cos = 3 / (√2 · √5), the biases are orthogonal (1 − 0)
    assert float(gradient_distance(a, b, "per_row")) == pytest.approx(0.0, abs=1e-6)
    assert float(gradient_distance(a, b, "whole")) == pytest.approx(1 - 3 / math.sqrt(10) + 1, abs=1e-6)
    assert float(gradient_distance(a, a)) == pytest.approx(0.0, abs=1e-6)
    # scale invariance of the whole-vector form (why a noised *sum* needs no division by a count)
    assert float(gradient_distance(a, [7 * t for t in b])) == pytest.approx(float(gradient_distance(a, b)), abs=1e-6)
    with pytest.raises(ValidationError, match="form"):
        gradient_distance(a, b, "rows")
    with pytest.raises(ValidationError, match="shapes differ"):
        gradient_distance(a, [b[0].T[:1], b[1]])


def test_head_gradients_match_autograd():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True)
    f = torch.randn(9, 6, generator=g)
    y = torch.randint(0, 4, (9,), generator=g)
    ref = torch.autograd.grad(F.cross_entropy(f @ w.T + b, y), [w, b])
    got = head_gradients(w.detach(), b.detach(), f, y)
    for r, x in zip(ref, got):
        assert torch.allclose(r, x, atol=1e-6)


def test_batched_distance_equals_per_class_sum():
    g = torch.Generator().manual_seed(1)
    p, w, b = torch.randn(5, 3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    targets = {c: (torch.randn(5, 8, generator=g), torch.randn(5, generator=g)) for c in (0, 3, 4)}
    loop = sum(float(gradient_distance(list(head_gradients(w, b, p[c], torch.full((3,), c))), list(targets[c])))
               for c in targets)
    assert float(matching_distance(p, w, b, targets)) == pytest.approx(loop, rel=1e-5)


@pytest.fixture(scope="module")
def split(real_store):
    part = make_partition(real_store, scheme="domain", seed=0)
    return part, part.split_store(real_store, "train"), part.split_store(real_store, "test")


def test_matching_lowers_the_distance_on_real_embeddings(split):
    _, train, _ = split
    g = torch.Generator().manual_seed(0)
    net = init_parameters(AdapterNet(train.dim, 10), g)
    anchors = orthogonal_anchors(10, 5, 128, g)
    assert torch.allclose(anchors.flatten(0, 1) @ anchors.flatten(0, 1).T, torch.eye(50), atol=1e-5)
    p = anchors.clone().requires_grad_(True)
    w, b = net.head.weight.detach(), net.head.bias.detach()
    targets = class_gradients(features_of(net, train.embeddings), train.labels, w, b)
    assert sorted(targets) == list(range(10))
    before, after = match_prototypes(p, torch.optim.Adam([p], lr=0.01), w, b, targets, steps=30)
    assert before == pytest.approx(float(matching_distance(anchors, w, b, targets)), rel=1e-5)
    assert after < 0.5 * before, (before, after)
    assert after == pytest.approx(float(matching_distance(p.detach(), w, b, targets)), rel=1e-5)


def test_matched_prototypes_classify_held_out_real_embeddings(split):
    """Without the contrastive/consistency terms the prototypes do not shape the features, so the
    prototype head is informative only through gradient matching: matched ≫ chance, unmatched ≈ chance."""
    _, train, test = split
    y = test.labels.numpy()
    acc = {}
    for matching in ("synthetic", "none"):
        clf = HyperPrototypeClassifier(lambda_contrastive=0.0, lambda_consistency=0.0, matching=matching, epochs=8,
                                       head="prototype", seed=0).fit(train.embeddings, train.labels.numpy())
        acc[matching] = float((clf.predict(test.embeddings) == y).mean())
    assert acc["synthetic"] > 0.4, acc                # chance: 0.1 (10 balanced classes)
    assert acc["synthetic"] > acc["none"] + 0.2, acc
    assert clf.history_[0].get("match_before") is None  # matching="none" never matched
