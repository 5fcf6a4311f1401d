"""Which classes a run's DP class counts cannot tell from absent (post-processing of DP outputs, no ε).

Every class is drawn whatever the code. A class is drawn from what the release says of it: the DP class
statistics of the clients whose code is used (``client:`` / ``mixture:``), or the federation's pooled ones.
Whether a client — or the whole federation — holds any record of a class is read from the clients' DP class
counts (model metadata ``client_class_counts``: public DP outputs, floored at 0) against the noise on them:

* each client's count of each class carries Gaussian noise of std ``s = σ / b``: σ the noise multiplier of
  the statistics step of the release (the last of ``privacy_plan.prefix``, the release's steps: after the
  centre when the release is centred, :func:`fedhype.privacy.centring.release_steps`) and ``b`` the count
  weight of the release (:meth:`fedhype.privacy.dp_step.ReleaseWeights.noise_std`), both from the run's
  ``config.json`` (:func:`count_noise_std`); 0 for a run trained without DP;
* the sum of J clients' counts carries std ``s·√J``; a sum at or below :data:`ABSENT_Z` of those std cannot
  be told from 0 (a class no client holds reaches it with probability ≈ 0.1 % per client count summed).

A class whose pooled count (all clients) cannot be told from 0 may be held by no client at all: the model's
class statistics of it are DP noise, and so are its samples, for every code (:func:`absent_note`). A class
that the clients of a ``client:`` / ``mixture:`` code cannot be told to hold is drawn from the federation's
pooled statistics instead (:func:`fedhype.synthesis.sample.few_classes_note`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

#: a (summed) DP class count at or below this many noise standard deviations cannot be told from 0
ABSENT_Z = 3.0


@dataclass(frozen=True)
class UnclearClass:
    """A class whose (summed) DP count cannot be told from 0: ``index``, ``name``, the summed DP ``count`` (each
    client's floored at 0) and the ``std`` of its noise (0 without DP)."""

    index: int
    name: str
    count: float
    std: float

    def describe(self, what: str = "DP count") -> str:
        if self.std == 0:
            return f"{self.name} (no record)"
        return f"{self.name} ({what} {self.count:.1f} ± {self.std:.1f})"

    def as_dict(self) -> dict:
        return {"class": self.name, "dp_count": round(self.count, 3), "noise_std": round(self.std, 3)}


def count_noise_std(run_dir: str | Path, model_cfg=None) -> float | None:
    """Std of the Gaussian noise on each client's DP count of each class, from the run's ``config.json``.

    Args:
        run_dir: the run directory (or release folder) holding ``config.json`` beside ``model.safetensors``.
        model_cfg: the model's :class:`~fedhype.models.config.ModelConfig` (whether the release carried second
            moments, which sets the count weight); default: from ``config.json``.

    Returns:
        ``σ / b`` (see the module docstring); 0.0 for a run trained without DP; None when it cannot be read (no
        ``config.json``, a run without the statistics release, secure aggregation — whose server sees only
        the sum — or settings this version cannot read).
    """
    import json

    path = Path(run_dir) / "config.json"
    try:
        conf = json.loads(path.read_text(encoding="utf-8"))
        train, privacy = dict(conf["train"]), dict(conf.get("privacy_plan") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        from fedhype.federated.config import TrainConfig
        from fedhype.models.config import ModelConfig

        cfg = TrainConfig(**train)
        if model_cfg is None:
            m = dict(conf["model"])
            model_cfg = ModelConfig(**{**m, "mmd_bandwidths": tuple(m.get("mmd_bandwidths", ()))})
        if not getattr(model_cfg, "class_bias", False) or cfg.secure_aggregation:
            return None
        if cfg.no_dp:
            return 0.0
        prefix = privacy.get("prefix")
        if prefix:  # the release's steps as planned and recorded: the statistics step is the last (after a centre)
            step = float(prefix[-1][0])
        else:
            sigma = privacy.get("class_stats_noise_multiplier")
            if sigma is None:
                return None
            from fedhype.privacy.centring import release_steps

            step = release_steps(float(sigma), float(cfg.centre_share))[-1][0]
        if not (math.isfinite(step) and step > 0):
            return None
        return float(cfg.release_weights(model_cfg).noise_std(step)["class_counts"])
    except Exception:  # noqa: BLE001 - settings of another version: the noise is unknown, not an error
        return None


def unclear_classes(counts, std: float, class_names, indices=None, z: float = ABSENT_Z) -> list[UnclearClass]:
    """The classes whose DP count summed over the clients ``indices`` (default: all) cannot be told from 0.

    Args:
        counts: the clients' DP class counts ``[m][K]`` (model metadata ``client_class_counts``).
        std: the noise std of one client's count (:func:`count_noise_std`).
        class_names: K names. z: the threshold, in noise standard deviations of the sum.

    Returns:
        one :class:`UnclearClass` per class whose summed count (each floored at 0) is ≤ ``z · std · √J``.
    """
    idx = list(range(len(counts))) if indices is None else list(indices)
    if not idx:
        return []
    sd = float(std) * math.sqrt(len(idx))
    out = []
    for k, name in enumerate(class_names):
        c = sum(max(0.0, float(counts[i][k])) for i in idx)
        if c <= z * sd:
            out.append(UnclearClass(k, str(name), c, sd))
    return out


def absent_note(unclear: list[UnclearClass], drawn: list[int], *, label_weights: list[float] | None,
                n_clients: int) -> str | None:
    """The warning for samples of classes that the release cannot tell from absent (None if none was drawn).

    Args:
        unclear: :func:`unclear_classes` of all clients. drawn: samples drawn of each class ``[K]``.
        label_weights: ``--label-weights`` as given (the advice keeps them for the other classes, and so the
            numbers drawn of those). n_clients: how many clients' counts were summed.
    """
    shown = [u for u in unclear if drawn[u.index] > 0]
    if not shown:
        return None
    k = len(drawn)
    weights = [0.0 if any(u.index == j for u in unclear) else (1.0 if label_weights is None else float(label_weights[j]))
               for j in range(k)]
    left = sum(d for j, d in enumerate(drawn) if weights[j] > 0)
    if left > 0 and any(w > 0 for w in weights):
        text = ",".join(f"{w:g}" for w in weights)
        # in both interfaces' terms: the Python API's warning named only the CLI's flags (a helper)
        advice = (f"drop them with `fedhype synthesize --n {left} --label-weights {text}` (the same numbers of the "
                  "other classes), or in Python keep the other classes of the returned store (`store.subset(...)`)")
    else:
        advice = "no other class was drawn"
    pooled = "pooled DP count" if n_clients > 1 else "DP count"
    exact = all(u.std == 0 for u in shown)
    if not exact and 2 * len(unclear) >= k:
        # a probe's small consortium (81 records per class, ε = 1, 3 sites) had most classes flagged, a different
        # few each run, and was told to keep a single class: at that noise the counts cannot tell which classes
        # are held, and dropping classes is no remedy
        return (f"{len(unclear)} of {k} classes have DP counts the release cannot tell from absent "
                f"({', '.join(u.describe(pooled) for u in unclear)}{within(len(unclear), False)}): at this ε and with "
                "so few records per class the counts cannot say which classes the clients hold, and the samples of "
                "every class may be mostly the model's noise (TSTR says how much is data); dropping classes does "
                "not help — a larger ε or more records per class would")
    return (f"class(es) the release cannot tell from absent: {', '.join(u.describe(pooled) for u in shown)}"
            f"{within(len(shown), exact)}: "
            + (f"no client holds them, and their {sum(drawn[u.index] for u in shown)} samples are the model's noise, "
               "not data" if exact else
               f"the clients may hold none of them (or only a few records), and their {sum(drawn[u.index] for u in shown)} "
               "samples may be the model's noise rather than data")
            + f"; {advice}")


def within(n: int, exact: bool) -> str:
    """How the classes named were judged, after their list: ``", within 3 noise std of 0"`` (nothing for exact counts)."""
    return "" if exact else f", {'each ' if n > 1 else ''}within {ABSENT_Z:g} noise std of 0"
