"""The main job through the Python API (what `fedhype run` does, shortened).

embed (cached) → partition by domain → FedHypeVAE under record-level DP at a target ε →
synthetic embeddings → fidelity and utility against held-out real embeddings → the shareable model.

    .venv/bin/python examples/python_api.py                 # ε = 1, 8 rounds (about 1 min on 2 cores)
    .venv/bin/python examples/python_api.py --epsilon 4 --rounds 4 --out /tmp/example-run
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import fedhype


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=1.0, help="target ε (δ = 1e-4)")
    ap.add_argument("--rounds", type=int, default=None, help="DP-SGD rounds (default 8; clients below "
                    "train.dp_sgd_min_records run none)")
    ap.add_argument("--limit", type=int, default=None, help="embed a stratified subset of N images")
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--out", type=Path, default=None, help="folder for the run and the saved model (default: a temporary one)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="fedhype-example-"))

    # 1. real embeddings of the bundled digits domains (reused from ~/.cache/fedhype when present)
    store = fedhype.embed("digits-domains", limit=a.limit, image_size=a.image_size)
    # 2. one client per domain; each client's records split 60/20/20 into train/val/test
    clients = fedhype.partition(store, scheme="domain")
    # 3. federated training under record-level DP: σ is calibrated so that the accountant's ε for
    #    the plan (the class-statistics release + every DP-SGD step) meets the target; every other
    #    setting is `fedhype run`'s default
    gen = fedhype.FedHypeVAE(epsilon=a.epsilon, rounds=a.rounds, seed=0, out=out / "run").fit(store, clients)
    spent = gen.privacy_spent()
    r = gen.result_  # ours runs no DP-SGD round where the median client has < 1,500 records (the digits domains)
    noise = (f"DP-SGD σ = {r['noise_multiplier']:.2f}" if r["noise_multiplier"] is not None else
             f"no DP-SGD round ({r['method']}: the release takes the whole ε), release σ₀ = "
             f"{r['class_stats_noise_multiplier']:.2f}")
    print(f"trained {r['rounds']} rounds over {len(spent.per_client)} clients: ε = {spent.epsilon:.3f} "
          f"(accountant), {noise}")
    # 4. synthetic embeddings: each class from the clients that hold it (the `mixture` code), 300 per class
    syn = gen.sample(per_class=300, seed=0)
    # 5. against the held-out real test split (never seen in training)
    ev = fedhype.evaluate(clients.split_store(store, "test"), syn, real_train=clients.split_store(store, "train"))
    print(ev)
    # 6. what may leave the site: the DP model, its ledger and its configuration (no client state)
    print(f"shareable model: {gen.save(out / 'model')}")


if __name__ == "__main__":
    main()
