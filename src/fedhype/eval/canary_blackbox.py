"""Black-box canary audit: input-space canaries, scored from synthetic data only.

One-run auditing (Steinke, Nasr & Jagielski, NeurIPS 2023, black-box setting with input-space
canaries): m canaries — random unit vectors with random labels, far from the real embeddings —
are each added with probability 1/2 to one client's training split; a fresh run is trained with
the given configuration, synthetic embeddings are drawn from that client's DP code, and each
canary is scored by minus its distance to the closest synthetic record (DCR, e.g. Stadler et al.,
USENIX Security 2022). The bound (:mod:`fedhype.eval.canary_bound`) uses only released outputs and
is expected near 0 for a DP run: a decoder trained under DP does not reproduce single records.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.nn import functional as F

from fedhype.data.partition import ClientSplit, Partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError, counted
from fedhype.eval.attacks import dcr_scores
from fedhype.eval.canary_bound import GUESS_IN, GUESS_OUT, audit_from_scores
from fedhype.eval.inputs import as_matrix


def add_input_canaries(store: EmbeddingStore, partition: Partition, client: int, n_canaries: int,
                       rng: np.random.Generator) -> tuple[EmbeddingStore, Partition, torch.Tensor, np.ndarray]:
    """Append m random unit-vector canaries (random labels) to ``store``; include each in ``client``'s
    train split with probability 1/2.

    Returns ``(store', partition', canaries float32 [m, D], included bool [m])``; excluded canaries
    are in the store but in no split, so no client ever sees them.
    """
    if not 0 <= client < len(partition.clients):
        raise ValidationError(f"client {client} does not exist; the partition has {counted(len(partition.clients), 'client')}")
    partition.check_store(store)
    can = F.normalize(torch.as_tensor(rng.standard_normal((n_canaries, store.dim)), dtype=torch.float32), dim=1)
    labels = torch.as_tensor(rng.integers(0, store.n_classes, n_canaries), dtype=torch.int64)
    included = rng.random(n_canaries) < 0.5
    ids = [f"audit-canary/{i}" for i in range(n_canaries)]
    aug = EmbeddingStore(torch.cat([store.embeddings, can]), torch.cat([store.labels, labels]),
                         torch.cat([store.domains, torch.zeros(n_canaries, dtype=torch.int64)]),
                         [*store.sample_ids, *ids], list(store.class_names), list(store.domain_names),
                         {**store.meta, "audit_canaries": n_canaries})
    clients = [ClientSplit(c.id, c.name, c.train + [i for i, keep in zip(ids, included) if keep] if c.id == client
                           else list(c.train), list(c.val), list(c.test)) for c in partition.clients]
    part = Partition(partition.scheme, {**partition.params, "audit_canaries": n_canaries}, partition.seed,
                     aug.digest(), len(aug), list(partition.class_names), clients)
    return aug, part, can, included


def black_box_audit(store: EmbeddingStore, partition: Partition, cfg, out: str | Path | None = None, *,
                    client: int = 0, n_canaries: int = 1000, per_class: int = 100, guess_in: float = GUESS_IN,
                    guess_out: float = GUESS_OUT, confidence: float = 0.95, seed: int = 0,
                    progress: Callable[[dict], None] | None = None) -> dict:
    """Train a run with input canaries in ``client``'s data and bound ε from synthetic samples only.

    Args:
        store / partition: the real data (canaries are added to a copy).
        cfg: :class:`~fedhype.federated.config.TrainConfig` of the audit run (its seed is set to ``seed``).
        out: run directory of the audit run (a temporary one, deleted afterwards, if None).
        per_class: synthetic samples per class drawn from the client's DP code.

    Returns:
        :func:`~fedhype.eval.canary_bound.audit_from_scores` (claim = the canary client's ledger ε)
        plus ``mode``, ``client``, ``audit_run``, ``n_synthetic``, ``private``.
    """
    from fedhype.federated.engine import train  # late: eval → federated/synthesis (later stages)
    from fedhype.synthesis.sample import synthesize

    rng = np.random.default_rng(seed)
    aug, part, can, included = add_input_canaries(store, partition, client, n_canaries, rng)
    cfg = dataclasses.replace(cfg, seed=seed)
    with tempfile.TemporaryDirectory(prefix="fedhype-audit-") as tmp:
        run_dir = Path(out) if out is not None else Path(tmp) / "run"
        res = train(aug, part, cfg, run_dir, diagnostics=False, progress=progress)
        cid = str(part.clients[client].id)
        syn = synthesize(run_dir, f"client:{cid}", per_class=per_class, seed=seed)
        scores = dcr_scores(as_matrix(syn, "l2", "synthetic set"), as_matrix(can, "l2", "canaries"))
    claim = res["epsilon_per_client"].get(cid) if res["private"] else None
    out_res = audit_from_scores(scores, included, delta=cfg.delta if res["private"] else 0.0, claimed_epsilon=claim,
                                confidence=confidence, guess_in=guess_in, guess_out=guess_out, seed=seed)
    out_res.update(mode="black-box", client=cid, audit_run=str(out) if out is not None else None,
                   n_synthetic=len(syn), private=res["private"], noise_multiplier=res["noise_multiplier"])
    return out_res
