"""The main job through the Python API, stage by stage (what `fedhype run` does, shortened).

embed (cached) → partition by domain → FedHypeVAE under record-level DP at a target ε →
synthesize from the neutral meta-code → fidelity and utility against held-out real embeddings.

    .venv/bin/python examples/python_api.py                 # ε = 1, 8 rounds (about 1 min on 2 cores)
    .venv/bin/python examples/python_api.py --epsilon 4 --rounds 4 --out /tmp/example-run
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from fedhype.data.partition import make_partition
from fedhype.encoders import cached_embed
from fedhype.eval.evaluate import evaluate
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.pipeline.config import DEFAULTS
from fedhype.synthesis import synthesize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=1.0, help="target ε (δ = 1e-4)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="embed a stratified subset of N images")
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a temporary folder)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="fedhype-example-")) / "run"

    # 1. real embeddings of the bundled digits domains (reused from ~/.cache/fedhype when present)
    store = cached_embed("digits-domains", "dinov2-vits14", limit=a.limit, image_size=a.image_size, progress=True)
    # 2. one client per domain; each client's records split 60/20/20 into train/val/test
    part = make_partition(store, scheme="domain")
    # 3. federated training under record-level DP: σ is calibrated so that the accountant's ε for
    #    the plan (the class-statistics release + every DP-SGD step) meets the target
    #    (the defaults of `fedhype run`; TrainConfig's own defaults are smaller steps for library use)
    cfg = TrainConfig(**{**DEFAULTS["train"], "rounds": a.rounds, "epsilon": a.epsilon, "seed": 0},
                      model=dict(DEFAULTS["model"]))
    res = train(store, part, cfg, out)
    print(f"trained {res['rounds']} rounds over {len(res['clients'])} clients: ε = {res['epsilon']:.3f} "
          f"(accountant), σ = {res['noise_multiplier']:.2f}")
    # 4. synthetic embeddings from the neutral meta-code, 300 per class
    syn = synthesize(out, "neutral", per_class=300, seed=0)
    # 5. against the held-out real test split (never seen in training)
    ev = evaluate(part.split_store(store, "test"), syn, real_train=part.split_store(store, "train"), seed=0)
    print(f"MMD² {ev['mmd2']:.3f}  FD {ev['fd']:.3f}  TSTR accuracy {ev['tstr_accuracy']:.3f}  "
          f"(TRTR {ev['trtr_accuracy']:.3f}, chance {1 / store.n_classes:.2f})")
    print(f"run directory: {out}")


if __name__ == "__main__":
    main()
