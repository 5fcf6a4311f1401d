"""Do the client codes capture their domains? The code × domain matrix of MMD² and TSTR.

For a trained run, synthetic embeddings are drawn from every client's code (``client:<id>``), the
neutral model and the mixture (:func:`fedhype.synthesis.synthesize`), and compared with each
client's held-out real test split (its domain) and with their union:

* MMD² (unbiased, Gretton et al. 2012, eq. 3; one RBF bandwidth for the whole matrix — the median
  heuristic on the pooled real test set — so that the cells are comparable);
* TSTR accuracy of a linear probe trained on the code's samples, on each domain's test split.

A code that captures its client has its row minimum at its own domain (the diagonal). Evaluation
figures use held-out real records: they are for the data holder and are not covered by DP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.eval.mmd import median_heuristic, mmd2_unbiased
from fedhype.eval.utility import Probe


def _subsample(x: torch.Tensor, y: torch.Tensor, n: int, rng: np.random.Generator):
    if x.shape[0] <= n:
        return x, y
    idx = torch.from_numpy(np.sort(rng.choice(x.shape[0], n, replace=False)))
    return x[idx], y[idx]


#: below this largest difference between two client codes' MMD² to any one domain the report calls the client codes
#: indistinguishable (the report prints MMD² to three decimals; a probe's five codes gave rows equal to them)
INDISTINGUISHABLE_MMD2 = 5e-4


def code_domain_matrix(run_dir: str | Path, domains: dict[str, EmbeddingStore], *, per_class: int = 100,
                       max_samples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """MMD² and TSTR of every code of a run against every domain's real test embeddings.

    Args:
        run_dir: a training run (``fedhype train`` output, or a job's ``run/``).
        domains: domain name → real test embeddings of that domain (in the run's client order,
            named like the run's clients; raw embeddings, L2-normalised here).
        per_class: synthetic samples per class and code.
        max_samples: each set is subsampled (seeded) to at most this many rows for MMD².
        seed: sampling and subsampling seed.

    Returns:
        ``{"codes": [str], "domains": [str] (+ "all"), "mmd2": [[float]] (codes × domains),
        "tstr": [[float]], "own_domain_is_closest": {client name: bool} (its code's MMD² is lowest at its own
        domain among the clients' domains), "own_code_is_closest": {client name: bool} (its own code's MMD² to its
        domain is below every other client code's), "codes_spread": float (the largest difference between two
        client codes' MMD² to one domain), "codes_indistinguishable": bool (``codes_spread`` below
        :data:`INDISTINGUISHABLE_MMD2`), "bandwidth": float}``.
        Codes: ``client:<name>`` for each client, then ``neutral`` (if the run has a shared code
        space) and ``mixture``.

    Raises:
        ValidationError / ArtifactError: as :func:`fedhype.synthesis.synthesize` (unreadable run, bad code).
    """
    from fedhype.federated.baselines import is_local
    from fedhype.federated.rundir import load_model
    from fedhype.synthesis import synthesize

    _, _, meta = load_model(run_dir)
    names = [str(n) for n in (meta.get("client_names") or meta["clients"])]
    codes = [f"client:{n}" for n in names] + ([] if is_local(meta.get("method") or "") else ["neutral"]) + ["mixture"]
    rng = np.random.default_rng(seed)
    real = {k: (torch.nn.functional.normalize(v.embeddings.float(), dim=-1), v.labels) for k, v in domains.items()}
    real["all"] = (torch.cat([x for x, _ in real.values()]), torch.cat([y for _, y in real.values()]))
    real = {k: _subsample(x, y, max_samples, rng) for k, (x, y) in real.items()}
    bw = median_heuristic(real["all"][0], rng)
    cols = list(real)
    mmd, tstr = [], []
    n_classes = len(meta["class_names"])
    for code in codes:
        syn = synthesize(run_dir, code, per_class=per_class, seed=seed)
        sx = torch.nn.functional.normalize(syn.embeddings.float(), dim=-1)
        sx_m, _ = _subsample(sx, syn.labels, max_samples, rng)
        mmd.append([mmd2_unbiased(real[c][0], sx_m, bw) for c in cols])
        probe = Probe(n_classes).fit(sx.numpy(), syn.labels.numpy())
        tstr.append([float(np.mean(probe.predict(real[c][0].numpy()) == real[c][1].numpy())) for c in cols])
    own = {n: int(np.argmin(mmd[i][:len(names)])) == i for i, n in enumerate(names) if n in real}
    # the other direction: is the client's own code closer to its domain than every other client's code? (a row
    # test alone said "yes" for the domain every code is closest to, with all client codes' rows the same)
    clients = np.asarray([row[:len(names)] for row in mmd[:len(names)]], dtype=float)
    own_code = {n: bool(all(clients[i, i] < clients[k, i] for k in range(len(names)) if k != i))
                for i, n in enumerate(names) if n in real}
    spread = float(np.ptp(clients, axis=0).max()) if len(names) > 1 else float("inf")
    return {"codes": codes, "domains": cols, "mmd2": mmd, "tstr": tstr, "own_domain_is_closest": own,
            "own_code_is_closest": own_code, "codes_spread": spread,
            "codes_indistinguishable": spread < INDISTINGUISHABLE_MMD2, "bandwidth": float(bw)}
