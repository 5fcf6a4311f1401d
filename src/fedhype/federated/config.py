"""Training configuration (one typed object, resolved once and written into the run directory)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from fedhype.errors import ValidationError
from fedhype.models.config import (ModelConfig, real_setting, resolve_code_dim, resolve_latent, switch_setting,
                                   whole_setting)
from fedhype.privacy.centring import DEFAULT_CENTRE_SHARE, DEFAULT_RADIUS, DEFAULT_RELEASE_CENTRE, RELEASE_CENTRES

#: How a method's clients train together (:attr:`Method.federation`): ``"federated"`` one server
#: aggregates every client's updates; ``"local"`` each client trains alone (one server per client,
#: :class:`fedhype.federated.baselines.LocalServers`); ``"pooled"`` one client holds every client's
#: records (a trusted curator, :func:`fedhype.federated.baselines.pooled_partition`).
FEDERATIONS = ("federated", "local", "pooled")

#: The CVAE of the predecessor (Di Salvo et al. 2025): one shared decoder averaged by FedAvg
#: (lr_server = 1), fixed N(0, I) prior, local encoders, no MMD, no Lipschitz term.
_PREDECESSOR = {"decoder": "shared", "prior": "standard", "lambda_mmd": 0.0, "lambda_lip": 0.0}


@dataclass(frozen=True)
class Method:
    """A training method (``--method``, ``train.method``): ours, a baseline or an ablation.

    Every method is one entry of :data:`METHOD_REGISTRY` (:func:`register_method`); the engine, the
    model loader, synthesis and the CLI ask the entry instead of testing the method's name.

    Attributes:
        name: the ``--method`` value.
        preset: :class:`ModelConfig` overrides applied on top of ``model`` (the user's keys win).
        federation: one of :data:`FEDERATIONS`.
        statistics_only: releases the DP statistics with the whole target ε and trains no DP-SGD
            round (the untrained model, the DP class-conditional Gaussian, is the result).
        no_secure_aggregation: why the method cannot release its statistics under secure
            aggregation, or None when it can.
        summary: a few words for ``fedhype train --help`` ("" for the name alone).
    """

    name: str
    preset: dict = field(default_factory=dict)
    federation: str = "federated"
    statistics_only: bool = False
    no_secure_aggregation: str | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        if self.federation not in FEDERATIONS:
            raise ValueError(f"Method {self.name!r}: federation must be one of {FEDERATIONS}, got {self.federation!r}")


#: Every training method by name, in ``--help`` order.
METHOD_REGISTRY: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` to :data:`METHOD_REGISTRY` (a baseline or ablation is one call); returns it.

    Raises:
        ValueError: a method of that name is registered already.
    """
    if method.name in METHOD_REGISTRY:
        raise ValueError(f"method {method.name!r} is registered already")
    METHOD_REGISTRY[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The registered method ``name``.

    Raises:
        ValidationError: no such method (naming the known ones).
    """
    try:
        return METHOD_REGISTRY[name]
    except (KeyError, TypeError):
        raise ValidationError(f"train.method must be one of {tuple(METHOD_REGISTRY)}, got {name!r}") from None


for _m in (
    Method("fedhypevae"),
    # the predecessor with correct accounting; the hypernetwork then has no heads and the codes are unused
    Method("dp-cvae", {**_PREDECESSOR, "class_bias": False},
           no_secure_aggregation="releases no statistics (class_bias off)"),
    Method("no-class-stats", {"class_bias": False}, no_secure_aggregation="releases no statistics (class_bias off)"),
    Method("no-mmd", {"lambda_mmd": 0.0}),
    Method("no-lipschitz", {"lambda_lip": 0.0}),
    Method("fixed-prior", {"prior": "standard"}),
    Method("shared-decoder", {"decoder": "shared"}),
    # no federation (fedhype.federated.baselines): the predecessor's CVAE (with the DP class statistics,
    # unlike dp-cvae) trained by each client alone, or on the pooled training records of every client
    # (one client; the upper bound with --no-dp)
    Method("local-cvae", {**_PREDECESSOR, "client_stats": False}, federation="local",
           no_secure_aggregation="keeps one model per client and needs each client's own release",
           summary="each client alone"),
    Method("central-cvae", {**_PREDECESSOR, "client_stats": False}, federation="pooled",
           no_secure_aggregation="pools the records into one client (nothing to aggregate)",
           summary="pooled records, one client"),
    # ablation: class sums and counts only (no second moments, no linear-Gaussian decoder path)
    Method("no-second-moment", {"second_moment": False}),
    # ablation: one pooled DP Gaussian for every code (no client-specific statistics heads)
    Method("no-client-stats", {"client_stats": False}),
    # the statistics alone: the one-shot release with the whole ε, sampled as the untrained model
    # (the DP class-conditional Gaussian), no DP-SGD rounds
    Method("dp-gaussian", {**_PREDECESSOR, "client_stats": False}, statistics_only=True,
           summary="the statistics release alone, no DP-SGD"),
    # ablation: ours without its DP-SGD stage — FedHypeVAE's model (the client-statistics heads, the mixture
    # code) from the statistics release with the whole ε and no round (docs/method.md, decision 21)
    Method("no-dp-sgd", {}, statistics_only=True, summary="ours without the DP-SGD stage (the release alone)"),
):
    register_method(_m)

#: ``--method`` presets by name (:attr:`Method.preset` of :data:`METHOD_REGISTRY`)
METHOD_PRESETS: dict[str, dict] = {name: m.preset for name, m in METHOD_REGISTRY.items()}
METHODS = tuple(METHOD_REGISTRY)
#: methods that cannot use secure aggregation, and why
NO_SECURE_AGGREGATION = {name: m.no_secure_aggregation for name, m in METHOD_REGISTRY.items() if m.no_secure_aggregation}
#: methods that release the statistics with the whole budget and train no DP-SGD round
STATISTICS_ONLY = tuple(name for name, m in METHOD_REGISTRY.items() if m.statistics_only)


#: the median client training-set size n_i below which ``fedhypevae`` runs without its DP-SGD stage: the
#: statistics release then takes the whole ε (the ``no-dp-sgd`` model; docs/method.md, decision 22, chosen on
#: validation splits: benchmarks/results/release_defaults.md, "DP-SGD stage, client size")
DEFAULT_DP_SGD_MIN_RECORDS = 1500
#: the method whose DP-SGD stage :attr:`TrainConfig.dp_sgd_min_records` switches off, and what it runs instead
STAGE_METHOD, NO_STAGE_METHOD = "fedhypevae", "no-dp-sgd"


def _positive(v: float) -> bool:
    """A finite number > 0 (NaN and inf are not)."""
    return math.isfinite(v) and v > 0


#: the ``fedhype train`` options of ``[train]`` whole-number keys (a refusal names them beside the key)
TRAIN_FLAGS = {"rounds": "--rounds", "local_steps": "--local-steps", "batch_size": "--batch-size",
               "min_records": "--min-records", "dp_sgd_min_records": "--dp-sgd-min-records",
               "dropout_tolerance": "--dropout-tolerance"}
#: the whole-number fields of :class:`TrainConfig` (:func:`~fedhype.models.config.whole_setting`): name, smallest
#: value, what a refusal says after that bound, the example it gives
_WHOLE_SETTINGS = (("rounds", 1, "", 8),
                   ("local_steps", 1, " or unset (train.local_epochs then sets the steps)", 10),
                   ("batch_size", 1, "", 256),
                   ("min_records", 0, " (0: no minimum)", 20),
                   ("dp_sgd_min_records", 0, " (0: always run the DP-SGD stage)", 1500),
                   ("dropout_tolerance", 0, "", 1))
#: the real-valued fields of :class:`TrainConfig` with their range (:func:`~fedhype.models.config.real_setting`;
#: ``epsilon`` and ``noise_multiplier`` are checked where they are used)
_REAL_SETTINGS = (("local_epochs", "a finite number > 0", _positive),
                  ("participation", "in (0, 1]", lambda v: 0 < v <= 1),
                  ("delta", "in (0, 1)", lambda v: 0 < v < 1),
                  ("clip_norm", "a finite number > 0", _positive),
                  ("lr_local", "a finite number > 0", _positive),
                  ("lr_server", "a finite number > 0", _positive),
                  ("lr_hyper", "a finite number > 0", _positive),
                  ("lr_code", "a finite number > 0", _positive),
                  ("class_stats_share", "in (0, 1)", lambda v: 0 < v < 1),
                  ("second_moment_share", "in [0, 0.95)", lambda v: 0 <= v < 0.95),
                  ("centre_share", "in [0, 1) (0: no centred release)", lambda v: 0 <= v < 1),
                  ("release_radius", "a finite number > 0", _positive),
                  ("class_stats_noise_multiplier", "a finite number > 0", _positive),
                  ("max_epsilon", "a finite number > 0 (or unset)", _positive))
#: those of them that may be None (unset)
_UNSET_REALS = ("lr_local", "class_stats_noise_multiplier", "max_epsilon")

#: the :class:`TrainConfig` fields only the DP-SGD rounds use (a statistics-only method ignores them:
#: :meth:`TrainConfig.unused_settings`)
ROUND_SETTINGS = ("rounds", "local_epochs", "local_steps", "batch_size", "participation", "lr_local", "lr_server",
                  "lr_hyper", "lr_code", "clip_norm", "class_stats_share")


@dataclass
class TrainConfig:
    """How a run trains and what privacy it buys.

    The field defaults are the shipped job's (``fedhype run``, ``fedhype train`` with no options):
    :data:`fedhype.pipeline.config.DEFAULTS` and every ``fedhype train`` / ``fedhype budget`` option
    default are read from here, so ``TrainConfig()`` is what ``fedhype train`` would use (with
    ``model`` empty: :class:`ModelConfig`'s defaults, which are the job's model too).

    Attributes:
        rounds: federated rounds R.
        local_epochs: local epochs per round; client i runs K_i = ceil(E · n_i / B) DP steps
            (ignored when ``local_steps`` is set).
        local_steps: fixed K for every client (overrides ``local_epochs``).
        batch_size: expected Poisson batch size B; client i samples with q_i = B / n_i.
        participation: fraction of clients sampled per round (public randomness).
        lr_local: Adam learning rate of the local steps (θ_i and ψ_i); None = :meth:`local_lr`'s
            default for the method's model.
        lr_server: SGD learning rate of the base decoder and head biases on the averaged Δθ (1.0 = FedAvg).
        lr_hyper: Adam learning rate of the hypernetwork trunk and head weights.
        lr_code: Adam learning rate of the client codes.
        epsilon: target ε (σ is calibrated for the plan actually run); None with ``noise_multiplier``.
        delta: δ.
        noise_multiplier: σ set directly (then ε is whatever the accountant says).
        clip_norm: C.
        class_stats_share: share of the target ε that the DP class statistics released before
            round 0 may cost on their own (their σ is calibrated for it; the DP-SGD σ is then
            calibrated so that both compose to the target). Used when ``model.class_bias``.
            Default 0.95, chosen on the digits validation split (benchmarks/results/release_defaults.md:
            the one-shot release carries the class signal).
        second_moment_share: share c² of the release's unit L2 sensitivity given to the
            second-moment matrix (:class:`fedhype.privacy.dp_step.ReleaseWeights`; the counts get
            :data:`~fedhype.privacy.dp_step.COUNT_SHARE`, the class sums the rest). Used when
            ``model.second_moment``; chosen on the digits validation split
            (benchmarks/results/release_defaults.md).
        centre_share: share s of the release's 1/σ₀² spent on a DP centre released first; the class
            statistics are then those of the records' deviations from it, clipped to a radius
            (:mod:`fedhype.privacy.centring`). 0 = the uncentred release. Both steps together cost
            the one release at σ₀ (Gaussian composition); chosen on the digits validation split
            (benchmarks/results/release_defaults.md, "centred release").
        release_radius: κ, the clip radius of the centred release in units of the DP root-mean-square
            distance of a record from the centre (post-processing of the centre release; no ε).
        release_centre: the centre each client's records are clipped around in the centred release:
            ``"client"`` its own DP centre pulled toward the pooled one by a James–Stein factor, one
            common radius (:func:`fedhype.privacy.centring.client_centrings`); ``"pooled"`` the pooled
            centre; ``"auto"`` (default) ``client``, or ``pooled`` under secure aggregation (the server
            sees only the sum of the centre releases). Post-processing of the centre release (no ε).
        class_stats_noise_multiplier: σ of that release set directly (default with an explicit
            ``noise_multiplier``: calibrated so the release alone costs ``class_stats_share`` × the
            DP-SGD steps' own ε).
        secure_aggregation: release the statistics before round 0 under secure aggregation with
            distributed noise (:mod:`fedhype.privacy.secure_agg`): each client adds the noise
            variance σ₀²/(m − t), the server learns only the sum, which carries σ₀² — √m less
            noise std on the pooled statistics than per-client releases at the same ε. The DP-SGD
            rounds stay per client with the full noise. Needs ≥ 2 clients and a method that pools
            the release (not ``local-cvae``, ``central-cvae``, ``dp-cvae``, ``no-class-stats``).
        dropout_tolerance: t, how many clients may be missing from the sum or collude with the server
            while the guarantee holds (0 ≤ t < m); each client's noise grows as 1/(m − t).
        no_dp: explicit non-private run (no clipping, no noise; outputs marked non-private).
        max_epsilon: refuse (exit 3) before a round that would take any client over this ε.
        seed: reproducible run (recorded as "not secure"); None = noise seeded from OS entropy.
        min_records: smallest client training set accepted (0: no minimum).
        dp_sgd_min_records: ``fedhypevae`` runs its DP-SGD stage only where the median client has at least this
            many training records (public sizes); below it the statistics release takes the whole ε and the model
            is ``no-dp-sgd``'s (:meth:`for_clients`; docs/method.md, decision 22). Per-client releases under DP
            only (the rule was not measured under secure aggregation or without DP); 0 always runs the stage.
        method: the name of a registered :class:`Method` (:data:`METHOD_REGISTRY`: ours, the baselines,
            the ablations).
        model: :class:`ModelConfig` overrides.
    """

    rounds: int = 8
    local_epochs: float = 2.0
    local_steps: int | None = None
    batch_size: int = 256
    participation: float = 1.0
    lr_local: float | None = None
    lr_server: float = 1.0
    lr_hyper: float = 1e-3
    lr_code: float = 1e-3
    epsilon: float | None = 1.0
    delta: float = 1e-4
    noise_multiplier: float | None = None
    clip_norm: float = 1.5
    class_stats_share: float = 0.95
    class_stats_noise_multiplier: float | None = None
    second_moment_share: float = 0.3
    centre_share: float = DEFAULT_CENTRE_SHARE
    release_radius: float = DEFAULT_RADIUS
    release_centre: str = DEFAULT_RELEASE_CENTRE
    secure_aggregation: bool = False
    dropout_tolerance: int = 0
    no_dp: bool = False
    max_epsilon: float | None = None
    seed: int | None = None
    min_records: int = 20
    # read when a config is made (not at import): tests of the DP-SGD path on small sets set the constant to 0
    dp_sgd_min_records: int = field(default_factory=lambda: DEFAULT_DP_SGD_MIN_RECORDS)
    method: str = "fedhypevae"
    model: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a probe's seed="abc" / 1.5 / 2**70 passed here and crashed inside torch after config.json was written
        if self.seed is not None:  # a numpy integer as the int config.json records
            self.seed = whole_setting("train.seed", self.seed, 0, below=2 ** 63, example=0,
                                      what=" and below 2^63, or none (noise from OS entropy)")
        # whole numbers, a numpy integer kept as the int config.json records: a quoted one raised a TypeError naming
        # no key, 8.5 and true were taken, min_records had no check at all (a reviewer's finding)
        for name, minimum, what, example in _WHOLE_SETTINGS:
            if name == "local_steps" and self.local_steps is None:
                continue
            setattr(self, name, whole_setting(f"train.{name}", getattr(self, name), minimum, flag=TRAIN_FLAGS.get(name),
                                              what=what, example=example))
        # real numbers: a quoted one raised a TypeError or passed (lr_server = "1"), true passed as 1 (ε, σ,
        # participation) and false as 0 (the shares), inf as C (no bound on a record's influence) and as E
        for name, must, ok in _REAL_SETTINGS:
            value = getattr(self, name)
            if value is None and name in _UNSET_REALS:
                continue
            setattr(self, name, real_setting(f"train.{name}", value, must, ok))
        # ε and σ: their type here, their range below where they are used (a --no-dp run has neither)
        if self.epsilon is not None:
            self.epsilon = real_setting("train.epsilon, the target ε,", self.epsilon, "a finite number > 0",
                                        lambda v: True, name="train.epsilon")
        if self.noise_multiplier is not None:
            self.noise_multiplier = real_setting("train.noise_multiplier", self.noise_multiplier, "a finite number > 0",
                                                 lambda v: True)
        if self.release_centre not in RELEASE_CENTRES:
            raise ValidationError(f"train.release_centre must be one of {list(RELEASE_CENTRES)}, got {self.release_centre!r}")
        switch_setting("train.secure_aggregation", self.secure_aggregation)
        switch_setting("train.no_dp", self.no_dp)  # the string "false" is true: it trained WITHOUT privacy
        if self.release_centre == "client" and self.secure_aggregation:
            raise ValidationError("train.release_centre = \"client\" needs each client's centre release, but under "
                                  "secure aggregation the server sees only their sum: use \"auto\" or \"pooled\"")
        get_method(self.method)  # a registered method (ValidationError naming the known ones)
        if self.dropout_tolerance and not self.secure_aggregation:
            raise ValidationError("--dropout-tolerance applies to secure aggregation: add --secure-aggregation or drop it")
        if self.secure_aggregation and self.no_dp:
            raise ValidationError("--secure-aggregation splits the noise of a private release; a --no-dp run adds "
                                  "none: drop one of the two")
        if self.secure_aggregation and self.method_spec.no_secure_aggregation:
            raise ValidationError(f"--secure-aggregation pools the clients' statistics release; method {self.method!r} "
                                  f"{self.method_spec.no_secure_aggregation}")
        if not self.no_dp:
            if self.noise_multiplier is None and self.epsilon is None:
                raise ValidationError("give --epsilon (target ε) or --noise-multiplier, or --no-dp for a non-private run")
            if self.noise_multiplier is not None and not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
                raise ValidationError(f"train.noise_multiplier (--noise-multiplier), the noise multiplier σ, must be a "
                                      f"finite number > 0, got {self.noise_multiplier} (σ = 0 gives no privacy: use "
                                      "--no-dp (train.no_dp = true) for an explicitly non-private run)")
            if self.noise_multiplier is None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
                raise ValidationError(f"train.epsilon, the target ε, must be a finite number > 0, got {self.epsilon}")

    def steps_per_round(self, n_records: int) -> int:
        """K_i for a client with ``n_records`` training records."""
        if self.local_steps is not None:
            return int(self.local_steps)
        return max(1, math.ceil(self.local_epochs * n_records / self.batch_size))

    def sample_rate(self, n_records: int) -> float:
        """q_i = min(1, B / n_i)."""
        return min(1.0, self.batch_size / n_records)

    @property
    def method_spec(self) -> Method:
        """The registered :class:`Method` of :attr:`method` (:data:`METHOD_REGISTRY`)."""
        return get_method(self.method)

    @property
    def statistics_only(self) -> bool:
        """True for a method that releases the statistics with the whole ε and trains no round."""
        return self.method_spec.statistics_only

    def rounds_run(self) -> int:
        """Rounds of DP-SGD actually run: ``rounds``, or 0 for a statistics-only method."""
        return 0 if self.statistics_only else int(self.rounds)

    def stage_rule_applies(self) -> bool:
        """True when the rule of :meth:`stage_off_reason` decides whether this configuration runs its training
        stage: ``fedhypevae`` without secure aggregation, on a model that releases statistics (``model.class_bias``;
        without a release the stage is all it learns) and ``dp_sgd_min_records > 0`` (docs/method.md, decisions 22
        and 25). Under DP the sizes then decide, without DP the stage is off (:meth:`for_clients`); False: the stage
        runs as the method says, whatever the sizes."""
        return (self.method == STAGE_METHOD and not self.secure_aggregation
                and bool(self.dp_sgd_min_records) and self.model_config(1, 2).class_bias)

    def stage_off_reason(self, sizes) -> str | None:
        """Why :meth:`for_clients` runs ``fedhypevae`` without its training stage for these client sizes, or None
        when it does not (:meth:`stage_rule_applies` is False — another method, secure aggregation, a model that
        releases no statistics (``model.class_bias = false``), ``dp_sgd_min_records = 0`` — no sizes, or, under DP,
        a median client of at least ``dp_sgd_min_records`` records). Without DP the stage is off whatever the sizes:
        the release is then the exact statistics, whose full-rank Gaussian was ahead of the trained model on every
        validation set (docs/method.md, decision 25).

        Args:
            sizes: the clients' training-set sizes n_i (public; an iterable of ints, or a name → size mapping).
        """
        values = sorted(int(n) for n in (sizes.values() if hasattr(sizes, "values") else sizes))
        if not values or not self.stage_rule_applies():
            return None
        import statistics

        if self.no_dp:
            return (f"without DP the statistics release is exact, and the full-rank Gaussian it gives was ahead of the "
                    f"trained model on every validation set: the job trains no round (the {NO_STAGE_METHOD!r} model; "
                    "docs/method.md, decision 25); train.dp_sgd_min_records = 0 runs the training stage (`fedhype train "
                    "--dp-sgd-min-records 0`, `fedhype run --set train.dp_sgd_min_records=0`)")
        median = statistics.median(values)
        if median >= self.dp_sgd_min_records:
            return None
        return (f"the median client has {median:,g} training records, fewer than train.dp_sgd_min_records = "
                f"{self.dp_sgd_min_records:,}: without the DP-SGD stage the statistics release takes the whole ε "
                f"(the {NO_STAGE_METHOD!r} model; docs/method.md, decision 22); train.dp_sgd_min_records = 0 runs the "
                "stage (`fedhype train --dp-sgd-min-records 0`, `fedhype run --set train.dp_sgd_min_records=0`)")

    def for_clients(self, sizes) -> "TrainConfig":
        """This configuration for clients of these sizes: ``method = "no-dp-sgd"`` where
        :meth:`stage_off_reason` says the DP-SGD stage is off, else itself (idempotent).

        Per-record DP-SGD noise shrinks as 1/n_i: on validation splits the stage paid its 5 % of ε with clients of
        ~4,150 and ~2,300 records (median; level at ε = 4 with the second) and not with clients of ~400–900
        (docs/method.md, decision 22). Client sizes are released exactly (README, "Privacy model"), so the rule
        spends no ε.

        Args:
            sizes: the clients' training-set sizes n_i (an iterable of ints, or a name → size mapping).
        """
        if self.stage_off_reason(sizes) is None:
            return self
        import dataclasses

        return dataclasses.replace(self, method=NO_STAGE_METHOD)

    def unused_settings(self) -> list[str]:
        """The ``train.*`` settings given away from their defaults that this run does not use, in field order.

        A statistics-only method (``dp-gaussian``, ``no-dp-sgd``) runs no DP-SGD round, so the round settings
        (:data:`ROUND_SETTINGS`) do nothing, and with ``class_stats_noise_multiplier`` set ``noise_multiplier`` is
        not the release's σ₀ either (:func:`fedhype.privacy.plan.plan_noise`). A probe's ``--rounds 5`` /
        ``--clip-norm 0.5`` were accepted silently and recorded as if they had run.
        """
        if not self.statistics_only:
            return []
        default = TrainConfig()
        out = [k for k in ROUND_SETTINGS if getattr(self, k) != getattr(default, k)]
        if self.class_stats_noise_multiplier is not None and self.noise_multiplier is not None:
            out.append("noise_multiplier")
        return out

    def plan_warnings(self, sizes: dict[str, int], batch_flag: str = "--batch-size") -> list[str]:
        """What ``train``, ``run`` and the API warn about a plan before it runs, in that order: δ not well below 1/n
        and a batch at or above a client's training set (private runs; the second only where DP-SGD steps
        subsample), and :meth:`unused_note` — for this configuration as :meth:`for_clients` resolves it for
        ``sizes`` (call it on the configuration as given: a round setting given to ``fedhypevae`` whose stage is
        off for these sizes is named, with the reason).

        Args:
            sizes: client name → training-set size n_i (public).
            batch_flag: how the batch size is named in the advice (``--batch-size``, ``train.batch_size``).
        """
        from fedhype.privacy.accountant import delta_advice, subsampling_advice

        cfg, off = self.for_clients(sizes), self.stage_off_reason(sizes)
        out = []
        if not cfg.no_dp:
            out += [delta_advice(cfg.delta, sizes),
                    None if cfg.statistics_only else subsampling_advice(cfg.batch_size, sizes, batch_flag)]
        return [a for a in (*out, cfg.unused_note(off)) if a]

    def unused_note(self, stage_off: str | None = None) -> str | None:
        """One sentence naming :meth:`unused_settings`, or None when there are none.

        Args:
            stage_off: :meth:`stage_off_reason` of the configuration as given, when :meth:`for_clients` turned
                ``fedhypevae`` into ``no-dp-sgd`` (the sentence then gives that reason instead of the method)."""
        names = self.unused_settings()
        if not names:
            return None
        why = ("runs no DP-SGD round (the statistics release takes the whole ε" + (
            f", at σ₀ = {self.class_stats_noise_multiplier:g}" if self.class_stats_noise_multiplier is not None else "")
            + ")")
        head = ("no training round runs (without DP the exact statistics' Gaussian is the model: docs/method.md "
                "decision 25)" if stage_off and self.no_dp else
                "no DP-SGD round runs (the median client is below train.dp_sgd_min_records: the stage rule, "
                "docs/method.md decision 22)" if stage_off else f"train.method = {self.method!r} {why}")
        return (f"{head}: " + ", ".join(f"train.{k}" for k in names)
                + (" has" if len(names) == 1 else " have") + " no effect (recorded in config.json as given)")

    def distributed_noise(self, n_clients: int):
        """The :class:`~fedhype.privacy.secure_agg.DistributedNoise` (m, t) of a run with secure aggregation, else None.

        Raises:
            ValidationError: fewer than 2 clients or t ≥ m (naming ``--dropout-tolerance``).
        """
        if not self.secure_aggregation:
            return None
        from fedhype.privacy.secure_agg import DistributedNoise

        return DistributedNoise(int(n_clients), int(self.dropout_tolerance))

    def centre_mode(self) -> str:
        """``"client"`` or ``"pooled"``: :attr:`release_centre` with ``auto`` resolved (pooled under secure aggregation)."""
        if self.release_centre == "auto":
            return "pooled" if self.secure_aggregation else "client"
        return self.release_centre

    def release_weights(self, model: ModelConfig):
        """The :class:`~fedhype.privacy.dp_step.ReleaseWeights` of the statistics release of ``model``."""
        from fedhype.privacy.dp_step import ReleaseWeights

        return ReleaseWeights.split(self.second_moment_share if model.linear_path else 0.0)

    def local_lr(self, model: ModelConfig) -> float:
        """The local learning rate: ``lr_local``, or 1e-3 for a model with the statistics-initialised
        linear-Gaussian path (1e-2 moved it away from the DP Gaussian it starts at: TSTR 0.774 vs 0.826
        without DP on the digits validation split, benchmarks/results/release_defaults.md) and 1e-2 without it (the
        earlier default, with which those models learn class structure within 8 rounds)."""
        if self.lr_local is not None:
            return float(self.lr_local)
        return 1e-3 if model.linear_path else 1e-2

    def model_config(self, dim: int, n_classes: int, n_train: int | None = None,
                     n_clients: int | None = None) -> ModelConfig:
        """The model of this run: the method's preset, then the user's ``model`` overrides.

        With ``secure_aggregation`` the server sees no client's own release, so the client-statistics
        heads are off (``client_stats = False``). ``latent = "auto"`` is resolved here
        (:func:`fedhype.models.config.resolve_latent`: 64 with DP, 128 with DP from 500 training records
        per class, ``dim`` without), and ``code_dim = "auto"`` (:func:`fedhype.models.config.resolve_code_dim`:
        the clients rounded up to a multiple of 32, from 32 to 128, where the model has client-statistics heads;
        32 without them).

        Args:
            dim: D. n_classes: K. n_train: the training records of all clients together, from the
                public roster (``None``: not known, as for a model built to validate options only).
            n_clients: the number of clients (``None``: not known)."""
        extra = {"client_stats": False} if self.secure_aggregation else {}
        kw = {**self.method_spec.preset, **self.model, **extra}
        per_class = None if n_train is None else n_train / max(int(n_classes), 1)
        kw["latent"] = resolve_latent(kw.get("latent", "auto"), dim, private=not self.no_dp,
                                      records_per_class=per_class)
        code_dim = kw.pop("code_dim", "auto")
        mcfg = ModelConfig(dim=dim, n_classes=n_classes, **kw)
        # "auto" sizes the code for the client-statistics heads (one code per client); without them 32
        return replace(mcfg, code_dim=resolve_code_dim(code_dim, n_clients if mcfg.client_heads else None))

    def to_dict(self) -> dict:
        return asdict(self)
