"""Client objective terms on tiny tensors with hand-computed values (FedHPro contrastive, margin, consistency)."""

import math

import pytest
import torch

from fedhype.errors import ValidationError
from fedhype.prototypes.losses import class_similarities, client_margin, consistency_loss, contrastive_loss

# class 0: two prototypes along e1 and e2 (norms 2 and 3: only directions count); class 1: twice −e2
P = torch.tensor([[[2.0, 0.0], [0.0, 3.0]], [[0.0, -1.0], [0.0, -1.0]]])
F3_4 = torch.tensor([[3.0, 4.0]])  # unit direction (0.6, 0.8)


def test_class_similarity_is_mean_cosine_over_prototypes():
    s = class_similarities(F3_4, P)
    # class 0: (cos(f, e1) + cos(f, e2)) / 2 = (0.6 + 0.8) / 2; class 1: cos(f, −e2) = −0.8
    assert s[0].tolist() == pytest.approx([0.7, -0.8], abs=1e-6)


def test_contrastive_loss_hand_computed_with_and_without_margin():
    y = torch.tensor([0])
    # τ = 1: logits (0.7, −0.8); loss = log(1 + e^{−(0.7 + 0.8)})
    assert float(contrastive_loss(F3_4, y, P, temperature=1.0)) == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-6)
    # margin 0.2 nats on the positive logit: log(1 + e^{−(0.5 + 0.8)})
    got = float(contrastive_loss(F3_4, y, P, temperature=1.0, margin=0.2))
    assert got == pytest.approx(math.log1p(math.exp(-1.3)), abs=1e-6)
    # τ = 0.5 doubles the logits: log(1 + e^{−(1.4 − 0.2 + 1.6)})
    got = float(contrastive_loss(F3_4, y, P, temperature=0.5, margin=0.2))
    assert got == pytest.approx(math.log1p(math.exp(-2.8)), abs=1e-6)
    # the wrong label costs more, and the margin only ever raises the loss
    assert float(contrastive_loss(F3_4, torch.tensor([1]), P, 1.0)) == pytest.approx(math.log1p(math.exp(1.5)), abs=1e-6)
    with pytest.raises(ValidationError, match="temperature"):
        contrastive_loss(F3_4, y, P, temperature=0.0)


def test_consistency_loss_hand_computed():
    # mean of class-0 prototypes (1, 1.5) → unit; ‖f̂ − ĉ‖² = 2 − 2 cos = 2 − 2·1.8/√3.25
    got = float(consistency_loss(F3_4, torch.tensor([0]), P))
    assert got == pytest.approx(2 - 2 * 1.8 / math.sqrt(3.25), abs=1e-6)
    # class 1: ĉ = −e2, cos = −0.8 → 3.6
    assert float(consistency_loss(F3_4, torch.tensor([1]), P)) == pytest.approx(3.6, abs=1e-6)
    both = consistency_loss(torch.cat([F3_4, F3_4]), torch.tensor([0, 1]), P, reduction="none")
    assert both.tolist() == pytest.approx([2 - 2 * 1.8 / math.sqrt(3.25), 3.6], abs=1e-6)


def test_client_margin_is_mean_pairwise_cosine_of_class_means():
    f = torch.tensor([[2.0, 0.0], [5.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 3.0]])
    y = torch.tensor([0, 0, 1, 2, 2])
    # class means of unit features: e1, e2, (1,1)/√2 → cosines 0, 1/√2, 1/√2 → mean √2/3
    assert float(client_margin(f, y)) == pytest.approx(math.sqrt(2) / 3, abs=1e-6)
    # opposite class means: mean cosine −1, clamped to 0; a single class: 0
    assert float(client_margin(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), torch.tensor([0, 1]))) == 0.0
    assert float(client_margin(f, torch.zeros(5, dtype=torch.long))) == 0.0
    # identical class means: cosine 1, clamped to 0.99
    assert float(client_margin(torch.tensor([[1.0, 0.0], [2.0, 0.0]]), torch.tensor([0, 1]))) == pytest.approx(0.99)
