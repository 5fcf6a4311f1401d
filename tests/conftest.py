"""Shared fixtures: one small real embeddings store, embedded once per machine and cached.

``real_store``: digits-domains (real MNIST, UCI optdigits, MNIST-M blend, rotated MNIST), a
stratified subset of ``REAL_STORE["limit"]`` images, embedded with the bundled real DINOv2
ViT-S/14 at a small input size. Cached under ``$FEDHYPE_TEST_CACHE`` (default
``/tmp/fedhype-test-cache``) and reused while its provenance key matches.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TEST_CACHE = Path(os.environ.get("FEDHYPE_TEST_CACHE") or "/tmp/fedhype-test-cache")

#: The cache key of the shared real store (see fedhype.encoders.cache.cached_embed).
REAL_STORE = {"dataset": "digits-domains", "encoder": "dinov2-vits14", "limit": 800, "seed": 0, "image_size": 84}


@pytest.fixture(scope="session", autouse=True)
def dp_sgd_stage_on():
    """Every test trains ``fedhypevae`` with its DP-SGD stage unless it says otherwise: the test sets have clients
    of 100–300 records, where the shipped rule (``train.dp_sgd_min_records``, docs/method.md decision 22) would
    switch the stage off and the DP-SGD path would go untested. A test of the rule gives the value it tests
    (``TrainConfig(dp_sgd_min_records=...)``, ``--dp-sgd-min-records``) or uses :data:`SHIPPED_DP_SGD_MIN_RECORDS`.
    The constant is read when a config is made, so configs these tests write for other processes carry the 0."""
    from fedhype.federated import config

    with pytest.MonkeyPatch.context() as mp:  # session-wide: before the session fixtures that train runs
        mp.setattr(config, "DEFAULT_DP_SGD_MIN_RECORDS", 0)
        yield


#: the shipped default of ``train.dp_sgd_min_records`` (before :func:`dp_sgd_stage_on` sets it to 0)
SHIPPED_DP_SGD_MIN_RECORDS = __import__("fedhype.federated.config", fromlist=["x"]).DEFAULT_DP_SGD_MIN_RECORDS


@pytest.fixture(scope="session")
def real_store():
    """:class:`~fedhype.data.store.EmbeddingStore` of 800 real digits × 384-d DINOv2 features (float32)."""
    from fedhype.encoders.cache import cached_embed

    return cached_embed(**REAL_STORE, cache_dir=TEST_CACHE / "embeddings", device="cpu", progress=False)


@pytest.fixture(scope="session")
def tiny_dinov2_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny ``Dinov2Model`` (hidden 32, 2 layers, patch 14) saved with save_pretrained."""
    import torch
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=14,
                       image_size=56)
    path = tmp_path_factory.mktemp("tiny-dinov2")
    Dinov2Model(cfg).eval().save_pretrained(path)
    return path


#: The small DP run that the audit tests share (σ = 1, 2 rounds × 2 steps, 2 iid clients).
# (without the DP class statistics, so the audit's arithmetic is that of the DP-SGD steps alone;
# tests/federated/test_class_stats.py audits a run with them)
AUDIT_SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8, "class_bias": False}
AUDIT_CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, delta=1e-4, seed=0,
                 model=AUDIT_SMALL)


@pytest.fixture(scope="session")
def audit_run(real_store, tmp_path_factory):
    """``(run_dir, partition)`` of one real DP run, trained once per session (audit tests)."""
    import shutil

    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train

    root = tmp_path_factory.getbasetemp() / "audit-shared"
    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    if not (root / "run" / "checkpoint.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        train(real_store, part, TrainConfig(**AUDIT_CFG), root / "run-tmp", diagnostics=False)
        (root / "run-tmp").rename(root / "run")
    return root / "run", part


@pytest.fixture(scope="session")
def skewed_federation(real_store, tmp_path_factory):
    """``(partition, clients, synthetic)``: 4 Dirichlet α = 0.2 clients of the real store (each lacks classes),
    their ``ClientSplits`` by name, and 100 synthetic embeddings per class from the class-conditional Gaussian
    fitted to their training records (``dp-gaussian`` without DP: a good synthetic store in under a second; the
    per-client downstream tests check the protocols, not the generator)."""
    from fedhype.data.partition import make_partition
    from fedhype.eval.interpolation import ClientSplits
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.synthesis import synthesize

    part = make_partition(real_store, scheme="dirichlet", n_clients=4, alpha=0.2, seed=0)
    run = tmp_path_factory.mktemp("skewed") / "run"
    # the model sizes this fixture was written with (ModelConfig's defaults then): the same synthetic store
    train(real_store, part, TrainConfig(method="dp-gaussian", no_dp=True, epsilon=None, seed=0,
                                        model={"hidden": 256, "latent": 100}), run, diagnostics=False)
    syn = synthesize(run, "mixture", per_class=100, seed=0)
    clients = {c.name: ClientSplits(*(part.client_store(real_store, c.id, s) for s in ("train", "val", "test")))
               for c in part.clients}
    return part, clients, syn
