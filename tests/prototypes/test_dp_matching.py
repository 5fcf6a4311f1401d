"""DP class-wise gradients: exact clipped sums, ledger events, ε = the accountant's, budget refusal."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhype.errors import BudgetExceededError, ValidationError
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.prototypes import HyperPrototypeClassifier
from fedhype.prototypes.dp_gradients import MECHANISM, dp_class_gradients


def _toy(seed=0, n=12, k=3, d=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g) * 3, torch.randint(0, k, (n,), generator=g),
            torch.randn(k, d, generator=g), torch.randn(k, generator=g))


def test_noise_free_release_is_the_clipped_class_sum_over_expected_count():
    f, y, w, b = _toy()
    ledger = PrivacyLedger(1e-5)
    out = dp_class_gradients(f, y, w, b, noise_multiplier=0.0, clip_norm=0.5, sample_rate=1.0,
                             generator=torch.Generator().manual_seed(0), ledger=ledger, client="7", round=3)
    for c in range(3):
        ref_w, ref_b = torch.zeros_like(w), torch.zeros_like(b)
        for j in (y == c).nonzero().flatten().tolist():   # single-example autograd, clipped by hand
            wj, bj = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            gw, gb = torch.autograd.grad(F.cross_entropy((f[j] @ wj.T + bj)[None], y[j:j + 1]), [wj, bj])
            scale = min(1.0, 0.5 / (float(torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())) + 1e-6))
            ref_w, ref_b = ref_w + scale * gw, ref_b + scale * gb
        assert torch.allclose(out[c][0], ref_w / 12, atol=1e-6) and torch.allclose(out[c][1], ref_b / 12, atol=1e-6)
    (event,) = ledger.events
    assert (event.client, event.round, event.mechanism, event.steps) == ("7", 3, MECHANISM, 1)
    assert (event.noise_multiplier, event.sample_rate, event.clip_norm) == (0.0, 1.0, 0.5)
    assert ledger.epsilon("7") == float("inf")             # σ = 0 releases unnoised sums


def test_noise_has_the_calibrated_scale_and_covers_absent_classes():
    f, y, w, b = _toy(n=6)
    y = torch.zeros_like(y)                              # classes 1 and 2 absent: pure noise N(0, σ²C²)/(q n)
    out = dp_class_gradients(f, y, w, b, noise_multiplier=2.0, clip_norm=1.5, sample_rate=1.0,
                             generator=torch.Generator().manual_seed(1), ledger=PrivacyLedger(1e-5), client="0")
    noise = torch.cat([torch.cat([out[c][0].flatten(), out[c][1]]) for c in (1, 2)]) * 6
    assert noise.abs().sum() > 0
    assert float(noise.std()) == pytest.approx(3.0, rel=0.5)   # σ·C = 3 (30 draws)
    with pytest.raises(ValidationError, match="sample_rate"):
        dp_class_gradients(f, y, w, b, noise_multiplier=1.0, clip_norm=1.0, sample_rate=0.0,
                           generator=torch.Generator(), ledger=PrivacyLedger(1e-5), client="0")


@pytest.fixture(scope="module")
def clients(real_store):
    from fedhype.data.partition import make_partition

    part = make_partition(real_store, scheme="domain", seed=0)
    out = {}
    for c in part.clients:
        s = part.client_store(real_store, c.id, "train")
        out[str(c.id)] = (s.embeddings, s.labels.numpy())
    return part, out


def test_dp_matching_records_events_and_reports_the_accountants_epsilon(real_store, clients):
    part, dp_clients = clients
    syn = part.split_store(real_store, "val")                  # stand-in for a synthetic store
    clf = HyperPrototypeClassifier(matching="dp", epochs=3, match_steps=3, noise_multiplier=1.2, clip_norm=1.0,
                                   delta=1e-4, dp_batch_size=32, seed=0)
    clf.fit(syn.embeddings, syn.labels.numpy(), classes=np.arange(10), dp_clients=dp_clients)
    ledger = clf.ledger_
    assert len(ledger) == 3 * len(dp_clients)
    assert {e.mechanism for e in ledger.events} == {MECHANISM}
    for cid, (x, _) in dp_clients.items():
        q = min(1.0, 32 / len(x))
        expected = epsilon([(1.2, q, 3)], 1e-4)               # the accountant on the events' (σ, q, steps)
        assert clf.privacy_["per_client"][cid] == pytest.approx(expected, abs=1e-9)
        assert [e.sample_rate for e in ledger.events if e.client == cid] == [q] * 3
    assert clf.privacy_["epsilon"] == pytest.approx(max(clf.privacy_["per_client"].values()))
    assert 0 < clf.privacy_["epsilon"] < 10
    assert all(r["match_after"] <= r["match_before"] + 1e-6 for r in clf.history_)


def test_dp_matching_composes_with_a_run_ledger_and_refuses_over_budget(real_store, clients):
    part, dp_clients = clients
    syn = part.split_store(real_store, "val")
    run = PrivacyLedger(1e-4)
    from fedhype.privacy.ledger import LedgerEvent

    run.record(LedgerEvent("0", 0, "dp-sgd", 1.0, 0.1, 50, 1.5))
    kw = dict(matching="dp", epochs=2, match_steps=1, noise_multiplier=1.0, delta=1e-4, seed=0)
    clf = HyperPrototypeClassifier(**kw).fit(syn.embeddings, syn.labels.numpy(), dp_clients=dp_clients, ledger=run)
    q0 = min(1.0, 64 / len(dp_clients["0"][0]))
    assert clf.privacy_["per_client"]["0"] == pytest.approx(epsilon([(1.0, 0.1, 50), (1.0, q0, 2)], 1e-4), abs=1e-9)
    with pytest.raises(BudgetExceededError) as info:
        HyperPrototypeClassifier(**kw, max_epsilon=0.05).fit(syn.embeddings, syn.labels.numpy(), dp_clients=dp_clients)
    assert info.value.epsilon > 0.05
    with pytest.raises(ValidationError, match="delta"):           # δ ≥ 1/n for a client of ~100 records
        HyperPrototypeClassifier(**{**kw, "delta": 0.5}).fit(syn.embeddings, syn.labels.numpy(), dp_clients=dp_clients)
    with pytest.raises(ValidationError, match="dp_clients"):
        HyperPrototypeClassifier(**kw).fit(syn.embeddings, syn.labels.numpy())
    with pytest.raises(ValidationError, match="only used with matching='dp'"):
        HyperPrototypeClassifier().fit(syn.embeddings, syn.labels.numpy(), dp_clients=dp_clients)
