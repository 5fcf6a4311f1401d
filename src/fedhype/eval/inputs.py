"""Inputs of every evaluation metric: the evaluation space, compatibility checks, subsampling.

Every metric in :mod:`fedhype.eval` reads embeddings through :func:`as_matrix`, so one choice of
*evaluation space* applies to real and synthetic sets alike:

* ``"l2"`` (default) — each row is divided by its Euclidean norm
  (:func:`torch.nn.functional.normalize`, eps 1e-12). A fixed transform: no statistic of any data
  set is used, so it leaks nothing and treats real and synthetic identically. Synthetic stores
  are already unit-norm (``meta["space"] == "l2"``), so this puts the real set in their space.
* ``"raw"`` — the embeddings as stored.

Randomness (subsamples, permutations, bootstrap) comes from a seed or a numpy ``Generator``
passed in; :func:`child_rngs` derives independent streams so that one metric's draws never
depend on whether another metric ran.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError

SPACES = ("l2", "raw")

ArrayLike = EmbeddingStore | torch.Tensor | np.ndarray


def check_space(space: str) -> str:
    """Return ``space`` if it is a known evaluation space.

    Raises:
        ValidationError: if ``space`` is not ``"l2"`` or ``"raw"``.
    """
    if space not in SPACES:
        raise ValidationError(f"space must be one of {list(SPACES)}, got {space!r}")
    return space


def as_matrix(x: ArrayLike, space: str = "l2", name: str = "embeddings") -> torch.Tensor:
    """Embeddings as a float32 CPU tensor ``[N, D]`` in the evaluation ``space``.

    Args:
        x: an :class:`EmbeddingStore`, or a ``[N, D]`` tensor / array.
        space: ``"l2"`` (row-wise unit norm) or ``"raw"``.
        name: used in error messages.

    Raises:
        ValidationError: if ``x`` is not 2-D, has non-finite values, or ``space`` is unknown.
    """
    check_space(space)
    if isinstance(x, EmbeddingStore):
        e = x.embeddings
    else:
        e = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    e = e.detach().to("cpu", torch.float32)
    if e.ndim != 2:
        raise ValidationError(f"{name}: expected a 2-D array [N, D], got shape {tuple(e.shape)}")
    if e.numel() and not torch.isfinite(e).all():
        raise ValidationError(f"{name}: embeddings contain NaN or Inf")
    if space == "l2":
        e = torch.nn.functional.normalize(e, p=2.0, dim=1)
    return e.contiguous()


def check_compatible(
    a: EmbeddingStore, b: EmbeddingStore, a_name: str = "real store", b_name: str = "synthetic store"
) -> None:
    """Check two stores can be compared: same embedding dimension D and same class names.

    Raises:
        ValidationError: naming both stores and the differing field (exit code 2).
    """
    if a.dim != b.dim:
        raise ValidationError(
            f"embedding dimension differs: {a_name} has D={a.dim}, {b_name} has D={b.dim}; "
            "compare stores made with the same encoder"
        )
    if list(a.class_names) != list(b.class_names):
        raise ValidationError(
            f"class names differ: {a_name} has {list(a.class_names)}, {b_name} has {list(b.class_names)}; "
            "compare stores with the same label set in the same order"
        )


def check_min_rows(x: torch.Tensor, n: int, name: str, why: str) -> None:
    """Raise :class:`ValidationError` if ``x`` has fewer than ``n`` rows (``why`` says for what)."""
    if x.shape[0] < n:
        raise ValidationError(f"{name}: {why} needs at least {n} samples, got {x.shape[0]}")


def child_rngs(seed: int | np.random.SeedSequence, n: int) -> list[np.random.Generator]:
    """``n`` independent numpy generators derived from ``seed`` (``SeedSequence.spawn``)."""
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
    return [np.random.default_rng(s) for s in ss.spawn(n)]


def subsample(x: torch.Tensor, max_n: int | None, rng: np.random.Generator) -> torch.Tensor:
    """At most ``max_n`` rows of ``x`` drawn without replacement (all rows, in order, if fewer).

    Args:
        x: ``[N, D]``.
        max_n: cap on the number of rows; ``None`` keeps all.
        rng: the source of randomness.
    """
    if max_n is None or x.shape[0] <= max_n:
        return x
    idx = np.sort(rng.choice(x.shape[0], size=int(max_n), replace=False))
    return x[torch.from_numpy(idx)]


def labels_of(store: EmbeddingStore) -> np.ndarray:
    """Labels as int64 numpy ``[N]``."""
    return store.labels.numpy().astype(np.int64, copy=False)


def present_domains(store: EmbeddingStore) -> Sequence[int]:
    """Domain ids that occur in ``store``, ascending."""
    return sorted(set(store.domains.tolist()))


def one_class_warning(test_store: EmbeddingStore) -> str | None:
    """The warning for a real reference of fewer than two classes, or None: accuracy on it is only the share of its
    records predicted as its class, which a constant classifier maximises; it says nothing of how the classes are
    told apart."""
    present = sorted(set(int(v) for v in test_store.labels.tolist()))
    if len(present) >= 2:
        return None
    names = [test_store.class_names[k] for k in present]
    return (f"the real reference holds {len(present)} class(es) ({', '.join(names) or 'none'}): accuracy on it is the "
            "share of its records predicted as that class (a constant classifier scores 1.0), so TSTR and TRTR say "
            "nothing of how classes are told apart; evaluate on data of two or more classes")


def whole_store_warning(store: EmbeddingStore, name: str) -> str | None:
    """The warning for a real reference that holds every record of the store as embedded (``len(store) ==
    meta["n"]``; a split or subset holds fewer), or None: if the model trained on some of them, TSTR and MMD²
    overstate what it does on unseen data."""
    n = store.meta.get("n")
    if store.kind != "real" or not isinstance(n, int) or n != len(store):
        return None
    return (f"{name} holds all {n} records of the store as embedded; if the model was trained on some of them, TSTR "
            "and MMD² overstate what it does on unseen data (give its held-out split, e.g. "
            "partition.split_store(store, 'test'))")


def shared_records_warning(real_test: EmbeddingStore, real_train: EmbeddingStore | None) -> str | None:
    """The warning for a TRTR reference trained on records of the real test set (shared sample ids), or None: TRTR
    then scores the classifier on records it was trained on (a helper's ``evaluate(test, syn, real_train=test)``
    read TRTR 1.0 without a word)."""
    if real_train is None:
        return None
    shared = len(set(real_test.sample_ids) & set(real_train.sample_ids))
    if not shared:
        return None
    return (f"the real training and test embeddings share {shared} of the test's {len(real_test)} records: TRTR is "
            "then scored on records its classifier was trained on, and overstates held-out accuracy; give the "
            "training split as the training embeddings (e.g. partition.split_store(store, 'train'))")


def check_not_test_records(real_test: EmbeddingStore, synthetic: EmbeddingStore, real_name: str, syn_name: str) -> None:
    """Refuse a store not marked synthetic that holds records of the real test set (shared sample ids) as the
    synthetic side: TSTR then trains its classifier on the test records themselves and scores 1.000, which measures
    nothing (a helper's ``evaluate(split_store(s, "test"), s)`` printed TSTR 1.000 under a mild kind warning). A real
    store disjoint from the test records stays allowed: a real-vs-real reference.

    Raises:
        ValidationError: naming both sides, how many records they share and what to give instead.
    """
    if synthetic.kind == "synthetic":
        return
    shared = len(set(real_test.sample_ids) & set(synthetic.sample_ids))
    how = "the same sample ids"
    if not shared and len(real_test) and len(synthetic):
        # the same images embedded again under other names (a helper's renamed copy scored TSTR 1.000): rows within
        # 1e-4 of a test record's embedding on the unit sphere; distinct images are far from that (the nearest pair
        # of distinct records of the tests' 800 real digits is 0.117 apart)
        from fedhype.data.store import near_duplicates

        shared = near_duplicates(real_test, synthetic, 1e-4)
        how = "embeddings within 1e-4 of theirs: the same images embedded again"
    if shared:
        from fedhype.errors import ValidationError

        raise ValidationError(
            f"{syn_name} (marked kind={synthetic.kind!r}, not 'synthetic') holds {shared} of the {len(real_test)} "
            f"records of {real_name} ({how}): its classifier would be trained on the test records "
            "themselves, so TSTR, MMD² and PRDC would measure nothing; give a synthetic store, or, for a real-vs-real "
            "reference, real records disjoint from the test split (the partition's train split)")


#: embedding provenance fields compared between a real store and a synthetic one (fedhype.data.sites.encoder_of)
PROVENANCE_KEYS = ("encoder", "weights_hash", "pooling", "preprocess")


def check_provenance(real: EmbeddingStore, synthetic: EmbeddingStore, real_name: str, syn_name: str, *,
                     partition=None, site=None) -> None:
    """Refuse to compare a synthetic store with real data it cannot be compared with, or with its own
    run's training records presented as held-out data.

    * the embedding: the encoder, its weights hash, pooling and preprocessing recorded in the synthetic
      store (its run's data, ``meta["embedding"]``) must be the real store's (a field missing on either
      side is not compared: stores written before provenance was recorded);
    * ``partition`` (a :class:`~fedhype.data.partition.Partition`): its random key must be among the
      run's data keys (``meta["data_keys"]``), else its held-out splits may hold the run's training records;
    * ``site`` (a :class:`~fedhype.data.sites.Site`): a site the run trained on must be evaluated with
      the split it trained with (the same site key), for the same reason.

    Raises:
        ArtifactError: naming both sides and what to pass instead (exit code 4, a mismatched artifact, as
            :meth:`fedhype.data.partition.Partition.check_store` and ``fedhype audit --mia`` report the same mismatch).
    """
    emb = synthetic.meta.get("embedding")
    if isinstance(emb, dict):
        from fedhype.data.sites import encoder_of

        mine = encoder_of(real)
        same_weights = mine.get("weights_hash") is not None and mine.get("weights_hash") == emb.get("weights_hash")
        for k in PROVENANCE_KEYS:
            a, b = mine.get(k), emb.get(k)
            if k == "encoder" and same_weights:
                continue  # the same weights under another local name
            if a is not None and b is not None and a != b:
                raise ArtifactError(f"{real_name} was embedded with {k} = {a!r}, and the data of the run that made "
                                      f"{syn_name} with {k} = {b!r}: the two are not comparable; embed the real data with the run's "
                                      "encoder and preprocessing (`fedhype embed` with the same --encoder and size)")
    keys = synthetic.meta.get("data_keys")
    if not keys:
        return
    why = partition.key_mismatch(keys) if partition is not None else None
    if why:
        raise ArtifactError(f"{why} ({syn_name}): it was made by another `fedhype partition` or edited, so its "
                            "held-out split may hold the run's training records; pass the partition the run "
                            "trained on")
    if site is not None:
        names = list(synthetic.meta.get("client_names") or [])
        if site.name in names and len(names) == len(keys) and keys[names.index(site.name)] != site.key:
            from fedhype.data.sites import split_file

            run_key = keys[names.index(site.name)]
            used = split_file(site.folder, run_key) if site.folder is not None else None
            raise ArtifactError(f"site {site.name!r} here has site key {site.key[:8]}…, while the site of that name "
                                  f"in the run of {syn_name} had site key {run_key[:8]}…: it was split again since "
                                  "(its test split may hold records the run trained on), or it is another site of the "
                                  "same name; " + (f"evaluate with the split the run used: --site {used}" if used else
                                  "evaluate with the split the run used (`fedhype site --overwrite` keeps the previous "
                                  f"one as site.{run_key[:8]}.json in the site folder; none is in {site.folder})"))
