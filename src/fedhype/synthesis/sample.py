"""Draw a synthetic embeddings store from a trained model (post-processing of DP outputs).

Reads only ``model.safetensors`` (Φ, the DP codes, public client sizes): never the clients'
records or private state. Output: an :class:`~fedhype.data.store.EmbeddingStore` in the same
format as ``fedhype embed`` writes, unit-norm embeddings (``meta["space"] = "l2"``), with
provenance (run id, ε, δ, code spec, seed, private flag).
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedhype import __version__
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.federated.baselines import is_local
from fedhype.federated.rundir import load_model, model_digest
from fedhype.models.config import DP_LATENT
from fedhype.models.cvae import sample
from fedhype.privacy.randomness import entropy_seed, noise_generator
from fedhype.synthesis.absent import absent_note, count_noise_std, unclear_classes, within
from fedhype.synthesis.anchor import anchored
from fedhype.synthesis.codes import parse_code_spec
from fedhype.synthesis.spent import checked_epsilon
from fedhype.synthesis.defaults import DEFAULT_ANCHOR


def class_labels(n_classes: int, *, per_class: int | None = None, n: int | None = None,
                 label_weights: list[float] | None = None, generator: torch.Generator,
                 class_names: list[str] | None = None) -> torch.Tensor:
    """Labels int64 [N]: ``per_class`` each, or ``n`` split by ``label_weights`` (uniform default; ``class_names``
    only name the classes in its error).

    With ``n``, counts are the largest-remainder rounding of n·w (deterministic), so the class
    proportions are exact up to one sample; order is shuffled with ``generator``. An ``n`` below the number
    of classes of positive weight is refused (every class is drawn: one would get none); a larger one may
    still round a class of small weight to none (:func:`empty_classes_note` names it).
    """
    if (per_class is None) == (n is None):
        raise ValidationError("give exactly one of --per-class or --n")
    if per_class is not None:
        if per_class < 1:
            raise ValidationError(f"--per-class must be ≥ 1, got {per_class}")
        counts = [per_class] * n_classes
    else:
        if n < 1:
            raise ValidationError(f"--n must be ≥ 1, got {n}")
        w = torch.tensor(label_weights if label_weights is not None else [1.0] * n_classes, dtype=torch.float64)
        # nan, inf or 1e400 (inf once parsed) reached torch as an internal error (a helper's --label-weights 1,1,1,inf)
        if (w.numel() != n_classes or not bool(torch.isfinite(w).all()) or (w < 0).any() or w.sum() <= 0
                or not bool(torch.isfinite(w.sum()))):
            names = (f" ({', '.join(class_names[:20])}{', …' if len(class_names) > 20 else ''}, in that order)"
                     if class_names else "")
            raise ValidationError(f"--label-weights needs {n_classes} finite non-negative numbers with a positive sum, one per "
                                  f"class{names}; got {w.numel()}: {', '.join(f'{x:g}' for x in w.tolist())}")
        drawn = int((w > 0).sum())
        if n < drawn:  # a probe's --n 3 with 4 classes left a class empty without a word
            which = f"{drawn} classes" + (" with a positive --label-weights" if label_weights is not None else "")
            raise ValidationError(
                f"--n {n} is fewer than the {which}: --n is the total number of synthetic embeddings, split between "
                f"the classes ({'by --label-weights' if label_weights is not None else 'evenly'}), so "
                f"{drawn - n} class(es) would get none; give --n {drawn} or more, --per-class N for N of every class, "
                "or --label-weights with 0 for the classes to leave out")
        exact = n * w / w.sum()
        counts = exact.floor().long()
        rest = n - int(counts.sum())
        order = torch.argsort(exact - counts, descending=True)
        counts[order[:rest]] += 1
        counts = counts.tolist()
    labels = torch.cat([torch.full((c,), k, dtype=torch.int64) for k, c in enumerate(counts)])
    return labels[torch.randperm(labels.numel(), generator=generator)]


#: ``per_class = "auto"``: samples per class from a DP model of latent L ≤ 64 / from a larger model (trained
#: without DP, or with DP on a large training set). A DP model of latent 64 gains nothing from more than 300
#: (benchmarks/results/synthetic_size.md); the full-rank model trained without DP (``model.latent =
#: "auto"``) needs more to show its covariance to a linear probe: validation TSTR 0.884 / 0.839 at 3,000
#: against 0.850 / 0.799 at 300 (digits / Fashion-MNIST, ours, 3 seeds; benchmarks/results/no_dp_rank.md),
#: and so does the L = 128 DP model of a large training set: the release alone 0.801 / 0.803 at 3,000
#: against 0.778 / 0.779 at 300 (all 70,000 Fashion-MNIST images, ε = 4 / 8, validation;
#: benchmarks/results/release_scale.md)
AUTO_PER_CLASS = {"dp": 300, "no_dp": 3000}


def auto_per_class(meta: dict, latent: int | None = None) -> int:
    """Samples per class for ``per_class = "auto"``: :data:`AUTO_PER_CLASS` ``"no_dp"`` (3,000) for a model
    trained without DP or of latent size above :data:`fedhype.models.config.DP_LATENT` = 64 (``latent``,
    the model's L), ``"dp"`` (300) otherwise.

    Args:
        meta: the model file's metadata (its ``private`` flag). latent: the model's L (``None``: unknown,
            counted as ≤ 64)."""
    large = latent is not None and int(latent) > DP_LATENT
    return AUTO_PER_CLASS["no_dp" if large or not meta.get("private", True) else "dp"]


def synthesize(model: str | Path, code: str = "neutral", *, per_class: int | str | None = None, n: int | None = None,
               label_weights: list[float] | None = None, seed: int | None = None, batch_size: int = 8192,
               temperature: float = 1.0, anchor: bool = DEFAULT_ANCHOR, device: str = "cpu") -> EmbeddingStore:
    """Synthetic embeddings from a run's model.

    Args:
        model: run directory or its ``model.safetensors``.
        code: code spec (see :mod:`fedhype.synthesis.codes`).
        per_class / n / label_weights: how many of each class (see :func:`class_labels`);
            ``per_class = "auto"``: :func:`auto_per_class` (300 from a DP model of latent ≤ 64, 3,000 otherwise).
        seed: sampling seed (None = OS entropy); sampling randomness is not a privacy parameter.
        batch_size: decoder batch size.
        temperature: scale of the prior's standard deviation (1 = the model's distribution).
        anchor: put each code's class means back on the statistics release's (:mod:`fedhype.synthesis.anchor`;
            post-processing, no ε). A model without release means (written before they were kept, an ablation
            without the linear-Gaussian start) is drawn unanchored; the provenance says so.

    Returns:
        EmbeddingStore with float32 [N, D] unit-norm embeddings; ``domains`` = source client for
        ``mixture``, else 0 (one domain named after the code spec). Its ``meta`` (the provenance) holds, besides
        the run's figures, ``count_noise_std`` (the noise std of one client's DP class count,
        :func:`fedhype.synthesis.absent.count_noise_std`; None where unknown), ``absent_classes`` (the classes
        whose pooled DP count cannot be told from 0: their samples are DP noise, not data;
        :func:`fedhype.synthesis.absent.unclear_classes`) and ``notes`` (``[{"kind", "text"}]``: ``absent``
        (:func:`fedhype.synthesis.absent.absent_note`), ``empty`` (:func:`empty_classes_note`), ``codes``
        (:func:`codes_note`), ``few`` (:func:`few_classes_note`), ``epsilon`` where the model's ε and its run's
        ledger's differ), joined in ``codes_note``. Its ``epsilon`` is checked against the run's ledger
        (:func:`fedhype.synthesis.spent.checked_epsilon`: the larger of the two; ``epsilon_source`` says which).

    Raises:
        ArtifactError: unreadable model, or an invalid (edited, truncated) ledger beside it; ValidationError: bad
            code spec or counts (an ``n`` below the number of
            classes drawn: :func:`class_labels`).
    """
    hnet, codes, meta = load_model(model)
    cfg = hnet.cfg
    clients, names = meta["clients"], meta.get("client_names") or meta["clients"]
    spec = parse_code_spec(code, clients, [str(x) for x in names], meta.get("client_sizes"))
    if is_local(meta) and spec.kind in ("neutral", "mix"):
        raise ValidationError(f"--code {code!r}: {model} is a local-cvae run (every client trained its own model, "
                              "there is no shared code space), so neutral and mix: codes are not meaningful; use "
                              "--code mixture (all clients in proportion to their public sizes), "
                              "mixture:<id>=<w>,... or client:<id>")
    # the one generator rule (OS entropy unless seeded); the seed drawn is kept in the provenance
    if per_class == "auto":
        per_class = auto_per_class(meta, cfg.latent)
    elif per_class is not None and (isinstance(per_class, bool) or not isinstance(per_class, int)):
        raise ValidationError(f"per_class must be \"auto\" or an integer ≥ 1, got {per_class!r}")
    seed_used = seed if seed is not None else entropy_seed(62)
    gen = noise_generator(seed_used)
    class_names = [str(c) for c in meta.get("class_names") or range(cfg.n_classes)]
    labels = class_labels(cfg.n_classes, per_class=per_class, n=n, label_weights=label_weights, generator=gen,
                          class_names=class_names)
    hnet = hnet.to(device).eval()
    out = torch.empty(labels.numel(), cfg.dim)
    domains = torch.zeros(labels.numel(), dtype=torch.int64)
    anchors: list[bool] = []

    def params(code_vec: torch.Tensor, client_stats: bool = True) -> dict:
        """θ of a code, anchored to the release's class means when asked and available."""
        theta = hnet(code_vec, client_stats=client_stats)
        target = hnet.release_class_means(code_vec, client_stats=client_stats) \
            if anchor and hasattr(hnet, "release_class_means") else None
        anchors.append(target is not None)
        return anchored(theta, target, cfg.n_classes, cfg.latent, temperature=temperature) if target is not None else theta

    with torch.no_grad():
        if spec.kind == "mixture":
            probs = mixture_source_probs(spec.weights, spec.indices, meta.get("client_class_counts"), cfg.n_classes)
            src = torch.multinomial(probs[labels], 1, replacement=True, generator=gen).flatten() if labels.numel() \
                else torch.zeros(0, dtype=torch.int64)
            domain_names = [str(names[i]) for i in spec.indices]
            for j, ci in enumerate(spec.indices):
                rows = (src == j).nonzero().flatten()
                if rows.numel():
                    theta = params(codes[ci])
                    out[rows] = _decode(theta, labels[rows], cfg, gen, batch_size, temperature, _space(hnet, codes[ci]))
                    domains[rows] = j
        else:
            code_vec = spec.code(codes, meta["client_sizes"])
            # neutral: the pooled statistics without any client's offsets (the domain-neutral model)
            theta = params(code_vec, client_stats=not (spec.kind == "neutral" and getattr(hnet.cfg, "client_heads", False)))
            out = _decode(theta, labels, cfg, gen, batch_size, temperature, _space(hnet, code_vec))
            domain_names = [spec.text]
    counts = torch.bincount(labels, minlength=cfg.n_classes).tolist()
    run_dir = Path(model) if Path(model).is_dir() else Path(model).parent
    std = count_noise_std(run_dir, cfg) if meta.get("client_class_counts") is not None else None
    unclear = unclear_classes(meta["client_class_counts"], std, class_names) if std is not None else []
    eps, eps_source, eps_note = checked_epsilon(run_dir, meta)
    notes = [("epsilon", eps_note),
             ("absent", absent_note(unclear, counts, label_weights=label_weights, n_clients=len(clients))),
             ("empty", empty_classes_note(counts, label_weights, class_names, n)),
             ("codes", codes_note(hnet, meta, spec.kind)),
             ("pooled", pooled_clients_note(spec, meta, names)),
             ("few", few_classes_note(spec, meta, cfg.n_classes, names, count_std=std,
                                      skip={u.index for u in unclear} | {k for k, c in enumerate(counts) if not c}))]
    notes = [{"kind": k, "text": t} for k, t in notes if t]
    note = "; ".join(x["text"] for x in notes) or None
    provenance = {
        **({"codes_note": note, "notes": notes} if note else {}),
        **({"absent_classes": [u.as_dict() for u in unclear]} if unclear else {}),
        "count_noise_std": std,
        "kind": "synthetic", "space": "l2", "run_id": meta.get("run_id"), "method": meta.get("method"),
        "epsilon": eps, "epsilon_source": eps_source, "delta": meta.get("delta"), "private": bool(meta.get("private")),
        "privacy": "DP (post-processing of the run's DP outputs)" if meta.get("private") else "NON-PRIVATE (trained with --no-dp)",
        "code": spec.text, "seed": seed_used, "seed_given": seed is not None, "temperature": temperature,
        "anchor": anchor_note(anchor, anchors), "model_digest": model_digest(model),
        "counts": counts, "fedhype_version": __version__,
        # provenance (public): the run's clients, their random data keys, how their data was embedded
        "client_names": list(meta.get("client_names") or []), "data_keys": meta.get("data_keys"),
        "embedding": meta.get("embedding"),
    }
    return EmbeddingStore(embeddings=out, labels=labels, domains=domains,
                          sample_ids=[f"syn/{i}" for i in range(labels.numel())],
                          class_names=list(meta["class_names"]), domain_names=domain_names, meta=provenance)


def anchor_note(asked: bool, anchored_codes: list[bool]) -> str:
    """Provenance ``anchor``: ``"release class means"``, ``"off"``, or why a model was drawn unanchored."""
    if not asked:
        return "off"
    if anchored_codes and all(anchored_codes):
        return "release class means"
    return ("none: the model holds no release class means (written before fedhype kept them, or an ablation "
            "without the linear-Gaussian start)")


def codes_note(hnet, meta: dict, kind: str) -> str | None:
    """Why a ``client:``/``mix:``/``mixture`` code of this model gives (nearly) the pooled model, or None.

    A model whose codes generate no client statistics (``model.client_stats`` off: ``dp-gaussian``,
    ``no-client-stats``, secure aggregation, the baselines) has one pooled decoder: its client codes
    differ only by what DP-SGD moved the FiLM and prior heads (nothing when it has none, or ran no round:
    ``meta["rounds_done"] == 0``).
    """
    if kind == "neutral" or is_local(meta) or getattr(hnet.cfg, "client_heads", False):
        return None
    trained = meta.get("rounds_done") != 0  # a statistics-only model (no DP-SGD round) moved no head
    why = ("it has no code-dependent parts" if not len(getattr(hnet, "heads", {}))
           else "its codes carry no client statistics, only what DP-SGD moved the FiLM and prior heads" if trained
           else "its codes carry no client statistics, and no DP-SGD round moved its heads")
    return (f"this {meta.get('method')} model has one pooled decoder ({why}): client and mixture codes sample "
            + ("(nearly) " if trained and len(getattr(hnet, "heads", {})) else "")
            + "the same distribution as --code neutral; per-client statistics need model.client_stats "
            "without secure aggregation")


def empty_classes_note(counts: list[int], label_weights: list[float] | None, class_names: list[str],
                       n: int | None) -> str | None:
    """The classes with a positive weight that the rounding of ``--n`` split by ``--label-weights`` left without
    a sample, or None (:func:`class_labels` refuses an ``--n`` below the number of such classes)."""
    if n is None:
        return None
    w = label_weights if label_weights is not None else [1.0] * len(counts)
    empty = [class_names[k] for k, c in enumerate(counts) if c == 0 and w[k] > 0]
    if not empty:
        return None
    return (f"class(es) {', '.join(empty)} got no sample: --n {n} split by --label-weights rounds their share below "
            "one; give a larger --n, or --per-class N for N of every class")


#: :func:`few_classes_note` without the count noise (no ``config.json`` beside the model): a class below this
#: fraction of a uniform share of the chosen clients' records
FEW_CLASS_SHARE = 0.2


def pooled_clients_note(spec, meta: dict, names) -> str | None:
    """The clients of a ``client:`` / ``mix:`` / ``mixture`` code whose own statistics the release's client
    shrinkage kept none of, or None.

    The client shrinkage (``model.client_shrinkage``, :mod:`fedhype.federated.client_shrinkage`) pulls each client's
    DP class means and covariance toward the pooled ones by a factor from its signal against the noise; at 0 (model
    metadata ``client_mean_shrinkage`` and ``client_cov_shrinkage``, post-processing of DP outputs) the client's
    code generates the pooled DP Gaussian — exactly the neutral code's draw in a model with no DP-SGD round
    (``rounds_done`` 0), that plus what the rounds learned otherwise. A probe's ``--code client:mnist-m`` gave the
    neutral code's rows without a word. None for ``neutral`` and for models without client statistics.
    """
    kept_mean, kept_cov = meta.get("client_mean_shrinkage"), meta.get("client_cov_shrinkage")
    if kept_mean is None or spec.kind not in ("client", "mix", "mixture"):
        return None
    chosen = [i for i, w in zip(spec.indices, spec.weights) if w > 0]
    pooled = [i for i in chosen if not kept_mean[i] and (kept_cov is None or not kept_cov[i])]
    if not pooled:
        return None
    one = len(pooled) == 1
    trained = meta.get("rounds_done") != 0
    same = not trained and len(pooled) == len(chosen)
    return (f"client(s) {', '.join(str(names[i]) for i in pooled)}: the release's client shrinkage kept none of "
            f"{'its' if one else 'their'} own class means and covariance (they did not stand out from the noise), so "
            f"{'its code gives' if one else 'their codes give'} the pooled DP Gaussian"
            + (" plus what the DP-SGD rounds learned" if trained else "")
            + (" — the same distribution as --code neutral" if same else ""))


def few_classes_note(spec, meta: dict, n_classes: int, names, count_std: float | None = None,
                     skip=()) -> str | None:
    """Which classes the clients of a ``client:`` / ``mixture:`` code cannot be told to hold, or None.

    Every class is drawn in the numbers asked, whatever the code; a client's model generates a class it
    lacks from the federation's pooled class statistics (the client statistics of a class at the count
    floor are the pool's, docs/method.md decision 11), not from its own records. Read from the clients'
    DP class counts (model metadata ``client_class_counts``, public DP outputs) against their noise: a class
    whose DP count summed over the code's clients (those of positive weight: a mixture draws each class from
    the clients that hold it, :func:`mixture_source_probs`) is at most :data:`fedhype.synthesis.absent.ABSENT_Z`
    noise standard deviations of the sum is named (:func:`fedhype.synthesis.absent.unclear_classes`;
    ``count_std``: the noise std of one client's count, :func:`fedhype.synthesis.absent.count_noise_std`).
    Without ``count_std`` (the noise unknown: no ``config.json`` beside the model) a class below
    :data:`FEW_CLASS_SHARE` / K of the weighted share Σ_j w_j n_jy / Σ_j w_j Σ_y' n_jy' of the chosen
    clients' records is named instead. Classes in ``skip`` (those the whole federation cannot be told to hold:
    :func:`fedhype.synthesis.absent.absent_note`) are left out. None for ``neutral`` / ``mix``, or without
    counts (secure aggregation, older models).
    """
    counts = meta.get("client_class_counts")
    if counts is None or spec.kind not in ("client", "mixture"):
        return None
    cls = [str(c) for c in meta.get("class_names") or range(n_classes)]
    who = ", ".join(str(names[i]) for i in spec.indices)
    if count_std is not None:
        idx = [i for i, w in zip(spec.indices, spec.weights) if w > 0]
        few = [u for u in unclear_classes(counts, count_std, cls, idx) if u.index not in set(skip)]
        if not few:
            return None
        what = "DP count" if len(idx) == 1 else "summed DP count"
        source = ("their own DP class statistics, which are noise for those classes (a local-cvae run has no "
                  "pooled model)" if is_local(meta) else
                  "the federation's pooled class statistics, not from these clients' own data")
        return (f"client(s) {who} cannot be told to hold class(es) {', '.join(u.describe(what) for u in few)}"
                f"{within(len(few), count_std == 0)}: those classes are drawn from {source} (--n with "
                "--label-weights 0 for them leaves them out)")
    c = torch.tensor([counts[i] for i in spec.indices], dtype=torch.float64).clamp_min(0)  # [J, K]
    w = torch.tensor(spec.weights if spec.kind == "mixture" else (1.0,), dtype=torch.float64)
    share = (w[:, None] * c / c.sum(1, keepdim=True).clamp_min(1e-12)).sum(0) / w.sum()
    few = [k for k in range(n_classes) if share[k] < FEW_CLASS_SHARE / n_classes and k not in set(skip)]
    if not few:
        return None
    return (f"client(s) {who} hold few or no records of class(es) {', '.join(cls[k] for k in few)} (their DP class "
            "counts; their noise is unknown: no config.json beside the model): those classes are drawn from the "
            "federation's pooled class statistics, not from these clients' own data (--n with --label-weights 0 "
            "for them leaves them out)")


def mixture_source_probs(weights, indices, class_counts, n_classes: int) -> torch.Tensor:
    """P(component j | class y) of a mixture ``Σ_j w_j p_j(x, y)``: float64 ``[K, J]``, rows sum to 1.

    With the clients' DP class counts n_{jy} (model metadata ``client_class_counts``, public DP
    outputs of the release) P(j | y) ∝ w_j · n_{jy} / Σ_y' n_{jy'} (Bayes' rule: the mixture's class
    y comes from client j in proportion to how much of client j is class y); so a client that
    holds few records of a class — none, under label skew — contributes few of its samples of that
    class. Without counts (secure aggregation, older models), or for a class no component holds,
    P(j | y) = w_j.
    """
    w = torch.tensor(weights, dtype=torch.float64)
    out = w.expand(n_classes, -1).clone()
    if class_counts is not None:
        c = torch.tensor([class_counts[i] for i in indices], dtype=torch.float64).clamp_min(0)  # [J, K]
        py = c / c.sum(1, keepdim=True).clamp_min(1e-12)
        joint = (w[:, None] * py).T  # [K, J]
        ok = joint.sum(1) > 0
        out[ok] = joint[ok]
    return out / out.sum(1, keepdim=True)


def _space(hnet, code: torch.Tensor):
    """The model space (m, s) of the model that ``code`` selects (DP outputs stored with Φ)."""
    return hnet.space_for(code) if hasattr(hnet, "space_for") else None


def _decode(theta, labels, cfg, gen, batch_size, temperature, space=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode ``labels`` batch by batch into ``out`` (float32 [N, D], allocated if None; no concatenation copy)."""
    out = torch.empty(labels.numel(), cfg.dim) if out is None else out
    for i in range(0, labels.numel(), batch_size):
        sample(theta, labels[i:i + batch_size], cfg, gen, temperature, space, out=out[i:i + batch_size])
    return out
