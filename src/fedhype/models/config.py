"""Model hyperparameters (one typed object, written into the run directory)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from fedhype.errors import ValidationError


#: the values of ``ModelConfig.client_shrinkage`` (besides true / false = "class" / "none"); each names
#: a rule of :data:`fedhype.federated.client_shrinkage.SHRINKAGE`
CLIENT_SHRINKAGE = ("none", "class", "client", "client-cov", "subspace")
#: the values of ``ModelConfig.residual``: where the variance the DP release cannot locate goes
#: (:func:`fedhype.federated.covariance.covariance_estimate`)
RESIDUALS = ("auto", "latent", "isotropic", "located")
#: default ``ModelConfig.residual``: ``"auto"`` = ``"located"`` where the release resolves at least
#: :data:`AUTO_LOCATED_FRACTION` of the latent directions (always without DP), ``"latent"`` below (digits,
#: Fashion-MNIST and all-70,000 Fashion-MNIST validation splits, 3 seeds: benchmarks/results/
#: release_defaults.md, "unlocated variance", "unlocated variance, no DP" and "unlocated variance, scale")
DEFAULT_RESIDUAL = "auto"
#: the fraction r / L of resolved latent directions from which ``"auto"`` puts the unlocated variance on
#: the located ones: measured r ≤ 14 of 64 where ``"latent"`` was better, r ≥ 35 where ``"located"`` was
AUTO_LOCATED_FRACTION = 0.5
#: ``ModelConfig.latent = "auto"`` under DP: L = 64 bounds the rank of the decoder's linear-Gaussian path to
#: the directions a DP release can resolve (digits validation split: benchmarks/results/release_defaults.md,
#: "no DP: lr_local, latent"; the release resolves 3–55 directions at ε = 1–8: class_covariance.md)
DP_LATENT = 64
#: ``ModelConfig.latent = "auto"`` under DP where the training set holds at least
#: :data:`SCALE_RECORDS_PER_CLASS` records per class: a release over that many records resolves more
#: directions than L = 64 keeps (benchmarks/results/release_scale.md)
SCALE_LATENT = 128
#: training records per class (the public roster's sizes summed, over the number of classes) from which
#: ``latent = "auto"`` under DP is :data:`SCALE_LATENT`. Validation split, 3 seeds
#: (benchmarks/results/release_scale.md, "L × synthetic records per class" and "the same setting on the
#: smaller datasets"): L = 128 with 3,000 synthetic per class and the latent residual gave ours +0.001 /
#: +0.007 / +0.009 at ε = 1 / 4 / 8 on Fashion-MNIST's 10,000 images (600 records per class) and the
#: release alone +0.005 / +0.004 / +0.004 on all 70,000 (4,200 per class), but ours −0.011 / −0.008 /
#: +0.005 on the bundled digits (about 410 per class). Only those two sizes bracket the threshold.
SCALE_RECORDS_PER_CLASS = 500
#: ``ModelConfig.located_share = "auto"`` (the default): the share s put on the located spikes where the DP class means
#: are precise (:data:`AUTO_SHARE_MIN_SNR`) and the release locates few directions (:data:`AUTO_SHARE_MAX_LOCATED`);
#: 0 elsewhere and without DP (:func:`fedhype.federated.covariance.resolve_located_share`, docs/method.md decision 16).
#: The same rule at any size: on all 70,000 Fashion-MNIST images (about 4,200 DP records per class) it turns s = 0.8 on
#: at ε = 1 with 10 clients (F 0.988, r 11-13; validation: ours 0.779 → 0.783, the release alone 0.778 → 0.781) and at
#: ε = 4 with 100 clients (F 0.989, r 12-14; ours 0.784 → 0.785, the release alone 0.782 → 0.786); every other scale
#: cell locates more than 20 directions or has F < 0.94 (benchmarks/results/release_defaults.md, "located share, scale")
AUTO_LOCATED_SHARE = 0.8
#: the pooled class means' James–Stein factor F (:func:`fedhype.federated.covariance.class_mean_snr`) from which
#: ``located_share = "auto"`` is :data:`AUTO_LOCATED_SHARE`. Validation splits (benchmarks/results/release_defaults.md,
#: "located share, auto"; residual_tradeoff.md): s = 0.8 cost TSTR where F ≤ 0.90 (digits ε = 1 / 4 per client), was
#: level where F ≈ 0.93 (Fashion-MNIST ε = 1 with secure aggregation) and level or better from F ≈ 0.946 (Fashion-MNIST
#: ε = 4, both sets at ε = 8, digits ε = 4 / 8 with secure aggregation); 0.94 keeps the F ≈ 0.93 cells at 0
AUTO_SHARE_MIN_SNR = 0.94
#: the most covariance directions the release may locate (r, :func:`fedhype.federated.covariance.covariance_estimate`)
#: for ``located_share = "auto"`` to be :data:`AUTO_LOCATED_SHARE`: the more directions are located, the more signal
#: the next eigenvectors that take the unlocated variance carry. Validation (same rows): s = 0.8 gained or was level at
#: r ≤ 17 (digits with secure aggregation at ε = 8: +0.014 for ours; Fashion-MNIST at ε = 4: level) and cost at r = 27
#: (Fashion-MNIST with secure aggregation at ε = 8: ours −0.005, the release alone −0.007)
AUTO_SHARE_MAX_LOCATED = 20
#: default ``ModelConfig.located_share``
DEFAULT_LOCATED_SHARE = "auto"
#: how the server pools the clients' released class sums into class means (``model.pooling``,
#: :mod:`fedhype.federated.pooling`): the plain sum, inverse-variance weights, random-effects weights
POOLINGS = ("sum", "inverse-variance", "random-effects")
DEFAULT_POOLING = "sum"
#: the ``fedhype train`` options of ``[model]`` keys (named in a refusal beside the key)
MODEL_FLAGS = {"hidden": "--hidden", "latent": "--latent"}


def _shown(value: Any) -> str:
    """A setting's value as a refusal shows it: a number as Python writes it (a numpy one as the plain number),
    anything else as its repr (cut at 80 characters)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "…"


def _kind_hint(key: str, value: Any, noun: str, example: Any, parse: Callable[[str], Any]) -> str:
    """What to give instead of a string or a bool given for the number ``key`` (else ""): a quoted number is
    told to be unquoted (with ``parse(text)`` as the example, or ``example`` where it returns None), other text
    to be ``noun``, true/false to be a number."""
    eg = "" if example is None else f", e.g. {key} = {example}"
    if isinstance(value, str):
        try:
            shown = parse(value.strip())
        except (ValueError, OverflowError):
            return f": give {noun}{eg}"
        return f": write it unquoted, e.g. {key} = {shown}" if shown is not None else f": write it unquoted{eg}"
    if isinstance(value, bool):
        return f": give a number, not true/false{eg}"
    return ""


def whole_setting(key: str, value: Any, minimum: int, *, flag: str | None = None, what: str = "",
                  example: int | None = None, below: int | None = None) -> int:
    """``value`` as an int if it is a whole number ≥ ``minimum`` (an int or a numpy integer:
    :class:`numbers.Integral`, never a bool), else a :class:`~fedhype.errors.ValidationError` naming the setting:
    ``"train.rounds (--rounds) must be a whole number ≥ 1, got '8': write it unquoted, e.g. train.rounds = 8"``.

    A float is refused even when it is whole (8.0: "write it without a decimal point"), a string that holds a
    whole number is told to be unquoted, a bool (true/false) to be a number; the job configuration converts its
    own keys' 8.0 to 8 before they get here (:func:`fedhype.pipeline.config.resolve`).

    Args:
        key: the setting as a configuration names it (``"train.rounds"``).
        value: what was given.
        minimum: the smallest value accepted.
        flag: the ``fedhype train`` option that sets it, named after the key (None: none).
        what: said after the bound, e.g. ``" (0: no minimum)"``.
        example: the value a hint gives (default: ``minimum``).
        below: an upper bound, exclusive (say it in ``what``); None: none.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum and (
            below is None or value < below):
        return int(value)
    example = minimum if example is None else example
    message = f"{key}{f' ({flag})' if flag else ''} must be a whole number ≥ {minimum}{what}, got {_shown(value)}"

    def as_whole(text: str) -> int | None:  # the whole number written, None below the minimum
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError(text)
        return int(text) if minimum <= int(text) < (below or math.inf) else None

    hint = _kind_hint(key, value, "a whole number", example, as_whole)
    if not hint and isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        whole = math.isfinite(value) and float(value).is_integer() and minimum <= value < (below or math.inf)
        hint = (f": write it without a decimal point, e.g. {key} = {int(value)}" if whole
                else f", e.g. {key} = {example}")
    elif not hint and not isinstance(value, numbers.Real):  # None, a list, …
        hint = f", e.g. {key} = {example}"
    raise ValidationError(message + hint)


def real_setting(key: str, value: Any, must: str, ok: Callable[[float], bool], *, name: str | None = None,
                 example: Any = None) -> Any:
    """``value`` if it is a real number (an int, a float or a numpy one: :class:`numbers.Real`, never a bool) for
    which ``ok(value)`` holds, else a :class:`~fedhype.errors.ValidationError` ``"{key} must be {must}, got …"``
    (with how to write a quoted number, or that true/false is no number). An int or float is returned as given
    (the configuration records it unchanged), a numpy number as a float.

    Args:
        key: the setting as a refusal names it (``"train.clip_norm"``, or with words after it, as
            ``"train.epsilon, the target ε,"``: then give ``name``).
        must: what it must be, e.g. ``"a finite number > 0"`` (say "finite" where ``ok`` refuses inf).
        ok: the test of its range (NaN fails any comparison; test ``math.isfinite`` where inf is wrong too).
        name: the key alone, for the hint's example (default: ``key``).
        example: the value a hint gives where the one written is no example (default: none).
    """
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if number and ok(float(value)):
        return value if isinstance(value, (int, float)) else float(value)

    def as_real(text: str) -> str | None:  # the number written, None where it is out of range
        return text if ok(float(text)) else None

    hint = "" if number else _kind_hint(name or key, value, "a number", example, as_real)
    raise ValidationError(f"{key} must be {must}, got {_shown(value)}{hint}")


def switch_setting(key: str, value: Any) -> bool:
    """``value`` if it is a bool, else a ValidationError ``"{key} must be true or false, got …"`` (a string
    ``"false"`` is truthy: it would have switched the setting on)."""
    if not isinstance(value, bool):
        raise ValidationError(f"{key} must be true or false, got {_shown(value)}")
    return value


def field_defaults(cls: type, *, factories: bool = False, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``{name: default}`` of a dataclass's fields that have a plain default (the one source of defaults); with
    ``factories`` also those with a default factory (called now: ``TrainConfig.dp_sgd_min_records`` reads its
    module constant when called); the fields in ``skip`` left out."""
    out = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        if f.default is not MISSING:
            out[f.name] = f.default
        elif factories and f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def resolve_latent(latent: int | str, dim: int, private: bool, records_per_class: float | None = None) -> int:
    """The latent size L of ``model.latent``: an integer as given; ``"auto"`` = ``dim`` (D: a full-rank
    linear-Gaussian path) without DP; under DP :data:`SCALE_LATENT` = 128 where the training set holds at
    least :data:`SCALE_RECORDS_PER_CLASS` = 500 records per class, else :data:`DP_LATENT` = 64 (at most ``dim``).

    Without DP the full-rank model with 3,000 synthetic embeddings per class (``synthesis.per_class =
    "auto"``) scores validation TSTR 0.884 / 0.839 against 0.864 / 0.814 at L = 64 with 300 per class
    (digits / Fashion-MNIST, ours, 3 seeds: benchmarks/results/no_dp_rank.md). Under DP the release
    resolves too few directions for more than 64 on the bundled digits (benchmarks/results/
    class_covariance.md); from 500 records per class L = 128 with 3,000 synthetic per class (the same
    ``"auto"`` of :func:`fedhype.synthesis.auto_per_class`) scores higher on the validation split
    (benchmarks/results/release_scale.md; the figures are at :data:`SCALE_RECORDS_PER_CLASS`).

    Args:
        latent: ``"auto"`` or a whole number ≥ 1 (a numpy integer too). dim: D, the embeddings' dimension.
            private: a DP run.
        records_per_class: n / K, the public training-set size over the number of classes; ``None``
            (not known: a model built for validation only) counts as below the threshold.

    Raises:
        ValidationError: ``latent`` is neither ``"auto"`` nor a whole number ≥ 1 (:func:`whole_setting`). (A
            ``latent`` above the embeddings' D is refused where the store is known:
            :func:`fedhype.federated.run_plan.check_plan`.)
    """
    if latent == "auto":
        if not private:
            return int(dim)
        scale = records_per_class is not None and records_per_class >= SCALE_RECORDS_PER_CLASS
        return min(SCALE_LATENT if scale else DP_LATENT, int(dim))
    return whole_setting("model.latent", latent, 1, flag=MODEL_FLAGS["latent"], what=' or "auto"', example=64)


#: ``ModelConfig.code_dim`` where no client count is known (a model built directly) and the least ``"auto"`` gives
DEFAULT_CODE_DIM = 32
#: the largest code dimension ``code_dim = "auto"`` gives: the client-statistics heads grow linearly in it
#: ((K + L + 1)·D weights per code coordinate), so past this many clients they are a least-squares fit
MAX_AUTO_CODE_DIM = 128


def resolve_code_dim(code_dim: int | str, n_clients: int | None = None) -> int:
    """The code dimension of ``model.code_dim``: a whole number as given; ``"auto"`` (the default) = the number
    of clients rounded up to a multiple of :data:`DEFAULT_CODE_DIM` (32), between 32 and :data:`MAX_AUTO_CODE_DIM`
    (128); 32 where the client count is not known.

    The client-statistics heads are linear in the code (:func:`fedhype.federated.class_stats.apply_client_stats`):
    h(c_i) reproduces client i's own DP Gaussian only while the m client codes are linearly independent, which
    needs code_dim ≥ m. With 100 clients and 32 dimensions the heads were a least-squares fit of the 100 clients'
    offsets, and the mixture code drew from a blur of them: behind the pooled release at ε = 8 on all 70,000
    Fashion-MNIST images. With a code per client (128 ≥ 100) the mixture's validation TSTR (3 seeds) rose at
    every ε (benchmarks/results/release_defaults.md, "code dimension, many clients"; docs/method.md decision 23).

    Args:
        code_dim: ``"auto"`` or a whole number ≥ 1 (a numpy integer too). n_clients: the run's clients
            (``None``: not known).

    Raises:
        ValidationError: ``code_dim`` is neither ``"auto"`` nor a whole number ≥ 1 (:func:`whole_setting`).
    """
    if code_dim == "auto":
        if n_clients is None:
            return DEFAULT_CODE_DIM
        step = DEFAULT_CODE_DIM
        return int(min(MAX_AUTO_CODE_DIM, max(step, -(-int(n_clients) // step) * step)))
    return whole_setting("model.code_dim", code_dim, 1, what=' or "auto"', example=DEFAULT_CODE_DIM)


@dataclass
class ModelConfig:
    """Sizes and loss weights of the hypernetwork CVAE.

    The field defaults are the shipped job's model (``fedhype run``, ``fedhype train``: the job's
    ``[model]`` section is read from here). The sizes differ from the predecessor DP-CVAE's (Di Salvo
    et al. 2025: 3 hidden layers of width 256, latent 100): width 128, whose DP-SGD gradients the noise
    swamps less at ε = 1, and latent 64 under DP, which bounds the rank of the decoder's linear-Gaussian
    path (chosen on the digits validation split: benchmarks/results/release_defaults.md, "no DP: lr_local,
    latent"), 128 under DP from 500 training records per class, D without DP (``latent = "auto"``:
    :func:`resolve_latent`). β = 0.1 and the rest follow the predecessor where FedHypeVAE (Gupta & Sethi 2026) is silent.

    Attributes:
        dim: D, embedding dimension.
        n_classes: K.
        latent: latent dimension L of z; ``"auto"`` (the job's default) is resolved by
            :func:`resolve_latent` where the run's privacy is known (:meth:`fedhype.federated.config.TrainConfig.model_config`:
            64 with DP, 128 with DP from 500 training records per class, D without); a ModelConfig built
            directly resolves it to :data:`DP_LATENT`.
        hidden: width of the CVAE's hidden layers (encoder and decoder: 3 each).
        code_dim: dimension of each client code c_i; ``"auto"`` (the default) is resolved by
            :func:`resolve_code_dim` where the number of clients is known (:meth:`fedhype.federated.config.TrainConfig.model_config`:
            the clients rounded up to a multiple of 32, from 32 to 128); a ModelConfig built directly resolves it to 32.
        hyper_hidden: width of the hypernetwork trunk (2 layers).
        decoder: ``"film"`` — the hypernetwork generates FiLM scales/shifts (γ, β) for the
            decoder's 3 hidden layers on top of a shared base decoder (our design, see
            :mod:`fedhype.models.hypernet`); ``"shared"`` — no FiLM (ablation / DP-CVAE).
        prior: ``"class"`` — class-conditional prior N(μ_{i,y}, diag σ²_{i,y}) generated from
            the code; ``"standard"`` — fixed N(0, I) (ablation / DP-CVAE).
        beta: weight β of the KL term.
        lambda_mmd: weight of the MMD alignment term.
        lambda_lip: weight of the Lipschitz penalty of h_Φ w.r.t. the code.
        mmd_samples: synthetic samples per real example for the MMD cross term.
        mmd_bandwidths: RBF bandwidths on the unit sphere (data-independent: no median heuristic
            on private data, docs/method.md decision 5).
        likelihood: ``"learned"`` per-dimension σ_x of the Gaussian likelihood, or ``"fixed"`` σ_x = 1.
        class_bias: a class-dependent output bias ``dec.cb`` [K, D] on the decoder, initialised
            from DP class means released before training, and a model space centred on the DP
            mean (:func:`fedhype.privacy.dp_step.privatize_class_sums`; ours, see
            :mod:`fedhype.federated.class_stats`). ``False``: the predecessor's un-centred space.
        second_moment: also release each client's second-moment matrix with the class statistics
            (:class:`fedhype.privacy.dp_step.ReleaseWeights`) and give the decoder a linear path
            ``z·W_lin`` initialised from the DP covariance (top eigenvectors above the noise edge plus
            an isotropic residual variance: probabilistic PCA), with the MLP output and the prior
            heads zeroed, so that the untrained model *is* the DP class-conditional Gaussian
            (``dp-gaussian``). Needs ``class_bias``. ``False``: the ``no-second-moment`` ablation.
        client_stats: the hypernetwork also generates client-specific offsets of the class bias, the
            linear path and the residual log σ_x (heads ``cs_cb_w``, ``cs_wl_w``, ``cs_lsx_w``), set before
            round 0 from each client's *own* DP release so that h(c_i) is client i's DP Gaussian and
            h(c̄) (the neutral meta-code) the pooled one (:func:`fedhype.federated.class_stats.apply_client_stats`).
            Only with ``linear_path``. ``False``: the ``no-client-stats`` ablation (and the baselines
            whose server sees no per-client release: ``dp-gaussian``, secure aggregation).
        client_shrinkage: with ``client_stats``, how each client's DP class means and covariance are
            pulled toward the pooled ones before they set the heads (post-processing, no ε):
            ``"none"`` (or false) keeps each client's own release; ``"class"`` (or true) shrinks each
            class mean and the covariance by its own positive-part James–Stein factor against the DP
            noise (:func:`fedhype.federated.client_shrinkage.shrink_toward`); ``"client"`` moves each
            class of a client by a factor from the client's signal variance, estimated from its
            deviations against DP *and* sampling noise (:func:`fedhype.federated.client_shrinkage.shrink_client`):
            about 0 for a client drawn from the pool's population (label skew only) and for a class it
            holds too few records of, about 1 for a distinct domain; the default,
            chosen on the digits and Fashion-MNIST validation splits (mixture TSTR, 3 seeds: digits
            0.532 / 0.702 / 0.750 → 0.552 / 0.708 / 0.750, Fashion 0.657 / 0.713 / 0.734 → 0.673 /
            0.745 / 0.766 at ε = 1 / 4 / 8; ``benchmarks/results/client_shrinkage.md``); ``"client-cov"`` is
            ``"client"`` with the covariance moved by no more than its own heterogeneity test allows
            (:func:`fedhype.federated.client_shrinkage.shrink_client_cov`): higher precision and coverage on
            label-skewed clients for a little TSTR (``benchmarks/results/release_defaults.md``, "client
            covariance test"); ``"subspace"`` is ``"client"`` with each class-mean deviation shrunk per block
            of the pooled DP covariance's eigenbasis (its leading 32 directions, the rest;
            :func:`fedhype.federated.client_shrinkage.shrink_client_subspace`): the noise the isotropic factor
            kept in every direction goes, the domain offsets along the data's leading directions stay
            (``benchmarks/results/client_subspace.md``). Without DP every mode keeps the client's own statistics.
        residual: with ``linear_path``, where the variance the DP release cannot locate (the trace left
            after the covariance spikes above the noise edge) goes: ``"latent"`` into the model's free
            latent directions along the next eigenvectors of the DP covariance (the default), or
            ``"isotropic"`` evenly over every other direction (probabilistic PCA's residual; the
            previous rule), or ``"located"`` into the located covariance spikes (samples on the few
            directions the release resolved: higher precision and coverage, lower recall and TSTR):
            :func:`fedhype.federated.covariance.covariance_estimate`. ``latent`` and ``isotropic`` are
            identical without DP (every latent direction is located). ``"auto"`` (the default) is
            ``"located"`` without DP, where only the D − L tail beyond the latent size is unlocated
            (validation TSTR of ours +0.016 digits / +0.006 Fashion-MNIST), and under DP ``"located"``
            where the release resolves at least half of an L ≤ 64 latent, ``"latent"`` otherwise
            (:func:`fedhype.federated.covariance.covariance_estimate`).
        located_share: where ``residual`` is (or ``"auto"`` resolves to) ``"latent"``, the share s ∈ [0, 1]
            of the unlocated variance first put on the located spikes (0: none; 1 is ``"located"``), or
            ``"auto"`` (the default): s = :data:`AUTO_LOCATED_SHARE` (0.8) where the release's pooled class means
            are precise (James–Stein factor F ≥ :data:`AUTO_SHARE_MIN_SNR`, 0.94) and the release locates at most
            :data:`AUTO_SHARE_MAX_LOCATED` covariance directions, else 0
            (:func:`fedhype.federated.covariance.resolve_located_share`; the share used and F are in the run's
            ``release.json`` and model metadata). s = 0.8 puts samples on the data's manifold (precision and
            coverage ≈ 0.01 → 0.3–0.5) at no TSTR cost where F is high, and costs TSTR where the class means are
            noisy (digits ε = 4, F ≈ 0.89: −0.016 on the test split) (docs/method.md, decision 16;
            benchmarks/results/release_defaults.md, "located share, auto"; residual_tradeoff.md).
        clip_rescale: with a centred release, map its statistics back as if clipping had shrunk every record's
            deviation from its centre by one common factor, the one that gives the unit records their exact mean
            ‖x‖² = 1 (:func:`fedhype.federated.class_stats.clip_rescale_factor`; post-processing, no ε). An
            option, off by default (docs/method.md, decision 19): with secure aggregation at ε = 8 it lifts
            validation TSTR of the release alone by +0.022 (digits) and +0.014 (all 70,000 Fashion-MNIST
            images) and of ours by +0.014 on digits (+0.001 on all 70,000 images), but where the class means
            are noisy (ε = 1 on the smaller sets) it costs 0.011–0.023, because it scales their noise up with
            them (benchmarks/results/release_defaults.md, "clip rescale").
        pooling: how the server pools the clients' per-client class sums into the class means (post-processing of
            the releases, no ε; :mod:`fedhype.federated.pooling`): ``"sum"`` adds them (each client's noise counts
            fully, whatever share of a class it holds), ``"inverse-variance"`` weights each client's class mean by
            n_ik²/R_i² (its DP count over its clip radius: the inverse of its noise variance; Cochran 1954),
            ``"random-effects"`` moves those weights toward the sum's as far as the clients' class means are found to
            scatter beyond their noise (DerSimonian & Laird 1986). Without DP, with one client and under secure
            aggregation (the server holds one sum) every rule is the sum. Measured: benchmarks/results/pooling.md.
    """

    dim: int
    n_classes: int
    latent: int | str = "auto"
    hidden: int = 128
    code_dim: int | str = "auto"
    hyper_hidden: int = 128
    decoder: str = "film"
    prior: str = "class"
    beta: float = 0.1
    lambda_mmd: float = 5.0
    lambda_lip: float = 1e-3
    mmd_samples: int = 4
    mmd_bandwidths: tuple[float, ...] = (0.5, 1.0, 2.0)
    likelihood: str = "learned"
    class_bias: bool = True
    second_moment: bool = True
    client_stats: bool = True
    client_shrinkage: bool | str = "client"
    residual: str = DEFAULT_RESIDUAL
    located_share: float | str = DEFAULT_LOCATED_SHARE
    clip_rescale: bool = False
    pooling: str = DEFAULT_POOLING

    @property
    def linear_path(self) -> bool:
        """Whether the decoder has the linear path ``dec.wl`` (class statistics with second moments)."""
        return bool(self.class_bias and self.second_moment)

    @property
    def client_heads(self) -> bool:
        """Whether h generates client-specific statistics offsets (``client_stats`` with the linear path)."""
        return bool(self.client_stats and self.linear_path)

    def __post_init__(self) -> None:
        # whole numbers ≥ 1 (a numpy integer as the int to_dict records; int("64") and int(64.5) let a quoted or
        # fractional size through, true passed as 1, and mmd_samples had no check: a reviewer's finding)
        self.code_dim = resolve_code_dim(self.code_dim)
        for name, example in (("dim", 384), ("n_classes", 10), ("hidden", 128), ("code_dim", 32),
                              ("hyper_hidden", 128), ("mmd_samples", 4)):
            setattr(self, name, whole_setting(f"model.{name}", getattr(self, name), 1, example=example,
                                              flag=MODEL_FLAGS.get(name)))
        self.latent = resolve_latent(self.latent, self.dim, private=True)
        if self.decoder not in ("film", "shared"):
            raise ValidationError(f"model.decoder must be 'film' or 'shared', got {self.decoder!r}")
        if self.likelihood not in ("learned", "fixed"):
            raise ValidationError(f"model.likelihood must be 'learned' or 'fixed', got {self.likelihood!r}")
        if self.prior not in ("class", "standard"):
            raise ValidationError(f"model.prior must be 'class' or 'standard', got {self.prior!r}")
        for name in ("beta", "lambda_mmd", "lambda_lip"):  # "0.5" passed as a string, NaN everything
            setattr(self, name, real_setting(f"model.{name}", getattr(self, name), "a finite number ≥ 0",
                                             lambda v: math.isfinite(v) and v >= 0))
        for name in ("class_bias", "second_moment", "client_stats"):  # the string "false" is true
            switch_setting(f"model.{name}", getattr(self, name))
        # a bool or one of the names: 1 and 0 equal True and False in Python, and slipped past this test into
        # the run's settings, failing only after the job folder was written (a probe's client_shrinkage=1)
        if not (isinstance(self.client_shrinkage, bool) or self.client_shrinkage in CLIENT_SHRINKAGE):
            raise ValidationError(f"model.client_shrinkage must be one of {list(CLIENT_SHRINKAGE)} (or true/false), "
                                  f"got {self.client_shrinkage!r}")
        if self.residual not in RESIDUALS:
            raise ValidationError(f"model.residual must be one of {list(RESIDUALS)}, got {self.residual!r}")
        share = self.located_share
        if share != "auto":
            if isinstance(share, bool) or not isinstance(share, numbers.Real) or not 0.0 <= float(share) <= 1.0:
                raise ValidationError(f"model.located_share must be \"auto\" or a number in [0, 1], got {share!r}")
            self.located_share = float(share)
        if not isinstance(self.clip_rescale, bool):
            raise ValidationError(f"model.clip_rescale must be true or false, got {self.clip_rescale!r}")
        if self.pooling not in POOLINGS:
            raise ValidationError(f"model.pooling must be one of {list(POOLINGS)}, got {self.pooling!r}")
        bands = self.mmd_bandwidths
        # a string or a number was read character by character or failed with a TypeError; 0 divides by zero in the
        # kernel, an empty list in its mean (the MMD term and the validation MMD² of every run)
        if isinstance(bands, (str, bytes)) or not hasattr(bands, "__iter__") or not (bands := tuple(bands)) or not all(
                isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) and b > 0 for b in bands):
            raise ValidationError("model.mmd_bandwidths must be a list of finite numbers > 0 (RBF bandwidths on the "
                                  "unit sphere), e.g. model.mmd_bandwidths = [0.5, 1.0, 2.0], got "
                                  f"{_shown(self.mmd_bandwidths)}")
        self.mmd_bandwidths = tuple(float(b) for b in bands)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mmd_bandwidths"] = list(self.mmd_bandwidths)
        return d
