"""``fedhype train``: federated FedHypeVAE training under record-level DP.

Every option's default is the main job's (``fedhype run``): the field defaults of
:class:`~fedhype.federated.config.TrainConfig` and :class:`~fedhype.models.config.ModelConfig`, from
which the job's ``[train]`` and ``[model]`` sections (:data:`fedhype.pipeline.config.DEFAULTS`) are
derived too; read when the command runs or prints its help (:func:`fedhype.cli.common.config_default`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer
from rich.console import Console

from fedhype.cli.choices import choice
from fedhype.federated.config import METHOD_REGISTRY, METHODS
from fedhype.privacy.centring import RELEASE_CENTRES
from fedhype.cli.common import (JobDefaultsCommand, JsonOpt, auto_or_count, class_list, client_labels, check_out_dir, check_out_kind, config_default,
                                config_option, console, existing, kv_table, log_line, print_above_target, round_printer,
                                run_command, seeded_note, warn, INTERRUPTED_TRAINING)
from fedhype.errors import ArtifactError, MinRecordsError, ValidationError
from fedhype.privacy.plan import MEANINGLESS_EPSILON

if TYPE_CHECKING:
    from fedhype.federated.config import TrainConfig

#: ``--method``'s help: every registered method, with its summary
_METHOD_HELP = " | ".join(f"{m.name} ({m.summary})" if m.summary else m.name for m in METHOD_REGISTRY.values()) + "."

#: (kept for callers of the old name) a default factory for ``section.key`` of the configuration
job_default = config_default


def _opt(key: str, *flags: str, help: str, section: str = "train", **kwargs: Any) -> Any:
    """An option defaulting to the configuration's ``section.key`` (:func:`~fedhype.cli.common.config_option`)."""
    return config_option(section, key, *flags, help=help, **kwargs)


def model_settings(items: list[str], **flags: Any) -> dict[str, Any]:
    """``fedhype train --set model.key=value``: the ``[model]`` settings that have no flag of their own (a probe
    found no way to set ``model.client_shrinkage`` from `train`). Values are read as TOML, as `fedhype run --set`.

    Raises:
        ValidationError: not ``model.<key>=<value>``, an unknown key, or a key whose flag (``flags``) is given too.
    """
    from fedhype.pipeline.config import DEFAULTS, _parse_value, _set_key

    conf = {"model": dict(DEFAULTS["model"])}
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not eq or section != "model" or not name:  # (no square brackets: the console reads them as markup)
            raise ValidationError(f"--set {item!r}: `fedhype train --set` takes model.key=value (e.g. "
                                  "model.client_shrinkage=client-cov)" + (
                                      f"; {section}.{name} is set with its flag (fedhype train --help)"
                                      if section == "train" and name in DEFAULTS["train"] else
                                      f"; there is no setting train.{name}, and the train settings have flags of "
                                      "their own (fedhype train --help)"
                                      if section == "train" and name else "; the train settings have flags of their own"))
        if flags.get(name) is not None:
            raise ValidationError(f"--set {item!r} and the flag of model.{name} set the same thing; give one")
        _set_key(conf, "model", name, _parse_value(value.strip()), where=f"--set {item!r}")  # the job's own checks
        out[name] = conf["model"][name]
    return out


def build_config(options: dict[str, Any], model: dict[str, Any]) -> "TrainConfig":
    """The :class:`~fedhype.federated.config.TrainConfig` of ``fedhype train`` options.

    Keys of ``fedhype run``'s ``[train]`` defaults without a flag are taken from there too, and
    ``model`` (the ``--hidden``/``--latent`` flags) overrides the job's ``[model]`` defaults, so
    that ``fedhype train`` with no options trains what ``fedhype run`` trains.

    Raises:
        ValidationError: a bad value (the model sizes are checked too).
    """
    from dataclasses import fields

    from fedhype.federated.config import TrainConfig
    from fedhype.pipeline.config import DEFAULTS

    names = {f.name for f in fields(TrainConfig)} - {"model"}
    kw = {**{k: v for k, v in DEFAULTS["train"].items() if k in names}, **options}
    if kw.get("noise_multiplier") is not None or kw.get("no_dp"):
        kw["epsilon"] = None
    cfg = TrainConfig(**kw, model={**DEFAULTS["model"], **{k: v for k, v in model.items() if v is not None}})
    cfg.model_config(1, 2)  # validates --hidden/--latent before any data is read
    return cfg


def explain_min_records(exc: ValidationError, *, records: str, partition: str) -> ValidationError:
    """The engine's "client below min_records" refusal (:class:`~fedhype.errors.MinRecordsError`), naming
    the options of this command; any other error is returned unchanged.

    Args:
        records: how the user sets the training minimum, e.g. ``"--min-records"``.
        partition: how the user re-partitions, e.g. ``"`fedhype partition` with fewer --clients and --min-records {need}"``
            (``{need}`` is replaced by the minimum).

    Returns:
        a :class:`~fedhype.errors.MinRecordsError` with the same fields and the reworded message.
    """
    if not isinstance(exc, MinRecordsError) or exc.stage != "train":
        return exc
    name, n, need = exc.client, exc.n, exc.minimum
    return MinRecordsError(
        f"client {name!r} has {n} training records, fewer than {records} {need} (the smallest client training "
        + (f"accepts); either lower {records} (to {n} or less) or re-partition so that every client has ≥ {need} "
           if n >= 1 else  # a client without training records cannot be helped by the minimum (a probe read "to 0")
           f"accepts); it has none, so re-partition so that every client has ≥ {need} ")
        + f"train records: {partition.replace('{need}', str(need))}",
        stage=exc.stage, minimum=need, clients=exc.clients, n_clients=exc.n_clients)


def _render(res: dict) -> None:
    rows = {k: res[k] for k in ("run_dir", "epsilon", "delta", "noise_multiplier", "rounds", "private", "noise_seeded")}
    if res.get("target_epsilon") is not None:
        rows["target ε"] = res["target_epsilon"]
    rows["clients"] = client_labels(res["clients"], res.get("client_names"))
    if res.get("secure_aggregation"):
        rows["secure aggregation"] = (f"m = {res['secure_aggregation']['clients']}, t = "
                                      f"{res['secure_aggregation']['dropout_tolerance']}")
    if res.get("rounds_planned"):  # a statistics-only run has no round and no DP-SGD σ: its release σ₀ (a probe)
        rows["upload bytes/round/client"] = res["traffic"]["upload_bytes_per_round"]
    elif res.get("class_stats_noise_multiplier") is not None:
        rows["release σ₀"] = res["class_stats_noise_multiplier"]
    Console().print(kv_table("fedhype train", rows))
    if not res["private"]:
        console.print("[bold yellow]NON-PRIVATE run (--no-dp): no DP guarantee on any output[/]")
    elif res.get("epsilon") is not None and res["epsilon"] > MEANINGLESS_EPSILON:
        # a probe's --noise-multiplier 0.001 reported ε = 5.5e5 as "private" without a word
        console.print(f"[bold yellow]warning[/]: ε = {res['epsilon']:.4g}: a guarantee this weak protects no record "
                      "(ε above 10 is rarely defended); raise --noise-multiplier or give --epsilon", highlight=False)
    if res.get("above_target"):
        print_above_target(res)





def _sites(store: Optional[Path], partition: Optional[Path], site: Optional[list[Path]], classes: Optional[str]):
    """The sites of ``--site`` (None with --store/--partition); refuses a mix or a half of either (exit 2)."""
    if site:
        if store is not None or partition is not None:
            raise ValidationError("--site trains a federation of sites, each with its own store; --store/--partition "
                                  "train a pooled store's partition: give one or the other")
        from fedhype.data.sites import Site

        for d in site:
            if not (d / "site.json").is_file():
                raise ValidationError(f"--site {d}: no site.json there; write it with `fedhype site --store ... "
                                      f"--name ... --out {d}`")
        return [Site.load(d) for d in site]
    if classes is not None:
        raise ValidationError("--classes names the classes of a federation of sites; use it with --site")
    if store is None or partition is None:
        raise ValidationError("give --store and --partition (a pooled store and its partition), or --site once per "
                              "site (folders from `fedhype site`)")
    return None


def register(app: typer.Typer) -> None:
    @app.command("train", cls=JobDefaultsCommand)
    def train_cmd(
        ctx: typer.Context,
        store: Optional[Path] = typer.Option(None, "--store", help="Embeddings store (from `fedhype embed`), with --partition.",
                                             callback=existing("embeddings store", "create it with `fedhype embed`")),
        partition: Optional[Path] = typer.Option(None, "--partition", help="Partition file (from `fedhype partition`).",
                                                 callback=existing("partition file", "create it with `fedhype partition`")),
        site: Optional[list[Path]] = typer.Option(None, "--site", help="A site folder (from `fedhype site`), once per site, "
                                                  "instead of --store/--partition: each client reads only its own "
                                                  "site's store; the run is given the sites' public cards only.",
                                                  callback=existing("site folder", "write it with `fedhype site`", kind="dir")),
        classes: Optional[str] = typer.Option(None, "--classes", help="With --site: the federation's class names, "
                                              "comma-separated, in label order (default: the sorted union of the "
                                              "sites' classes)."),
        out: Path = typer.Option(..., "--out", help="Run directory to write."),
        epsilon: Optional[float] = _opt("epsilon", "--epsilon", help="Target ε; σ is calibrated for the plan run."),
        delta: float = _opt("delta", "--delta", help="δ (must be < 1/n for every client)."),
        noise_multiplier: Optional[float] = _opt("noise_multiplier", "--noise-multiplier",
                                                 help="Set σ directly (overrides --epsilon)."),
        no_dp: bool = _opt("no_dp", "--no-dp", help="Explicitly NON-PRIVATE: no clipping, no noise; outputs marked non-private."),
        clip_norm: float = _opt("clip_norm", "--clip-norm", help="Per-example clipping norm C."),
        class_stats_share: float = _opt("class_stats_share", "--class-stats-share",
                                        help="Share of the target ε spent on the DP statistics (class sums, counts, "
                                             "second moments) released once before round 0 (the rest goes to DP-SGD; "
                                             "both compose to the target). Chosen on the digits validation split: "
                                             "benchmarks/results/release_defaults.md."),
        second_moment_share: float = _opt("second_moment_share", "--second-moment-share",
                                          help="Share c² of the release's unit sensitivity given to the second-moment "
                                               "matrix (its noise std is σ₀/c); 0 releases sums and counts only."),
        centre_share: float = _opt("centre_share", "--centre-share",
                                   help="Share of the release's budget spent first on a DP centre; the class "
                                        "statistics are then those of the deviations from it, clipped (less noise "
                                        "at the same ε). 0: the uncentred release."),
        release_radius: float = _opt("release_radius", "--release-radius",
                                     help="Clip radius of the centred release, in units of the DP spread of the "
                                          "records around the centre."),
        release_centre: str = _opt("release_centre", "--release-centre",
                                   help="Centre each client clips its records around in the centred release: client "
                                        "(its own DP centre, pulled toward the pooled one where its offset is mostly "
                                        "noise), pooled, or auto (client; pooled under --secure-aggregation).",
                                   click_type=choice(RELEASE_CENTRES)),
        secure_aggregation: bool = _opt("secure_aggregation", "--secure-aggregation",
                                        help="Release the statistics before round 0 under secure aggregation with "
                                             "distributed noise: each client adds σ₀²/(m − t), the server learns only the "
                                             "sum (which carries σ₀²): √m less noise on the pooled statistics at the same "
                                             "ε. Trusts the aggregation protocol (README, privacy model). In process only."),
        dropout_tolerance: int = _opt("dropout_tolerance", "--dropout-tolerance",
                                      help="With --secure-aggregation: t, how many clients may be missing from the sum "
                                           "or collude with the server while the guarantee holds (0 ≤ t < m)."),
        class_stats_noise_multiplier: Optional[float] = _opt(
            "class_stats_noise_multiplier", "--class-stats-noise-multiplier",
            help="σ₀ of the class-statistics release set directly (with --noise-multiplier; default: calibrated "
                 "from --class-stats-share, see `fedhype budget`)."),
        rounds: int = _opt("rounds", "--rounds", help="Federated rounds."),
        local_epochs: float = _opt("local_epochs", "--local-epochs", help="Local epochs per round (K_i = ceil(E·n_i/B))."),
        local_steps: Optional[int] = _opt("local_steps", "--local-steps",
                                          help="Fixed local steps per round (overrides --local-epochs)."),
        batch_size: int = _opt("batch_size", "--batch-size", help="Expected Poisson batch size B (q_i = B/n_i)."),
        participation: float = _opt("participation", "--participation", help="Fraction of clients per round."),
        lr_local: Optional[float] = _opt("lr_local", "--lr-local",
                                         help="Local Adam learning rate (default: 1e-3 for models initialised from the "
                                              "second moments, 1e-2 for the others)."),
        max_epsilon: Optional[float] = _opt("max_epsilon", "--max-epsilon", help="Refuse (exit 3) before exceeding this ε."),
        min_records: int = _opt("min_records", "--min-records",
                                help="Refuse a client with fewer training records (`fedhype partition --min-records` "
                                     "is the partition-time minimum)."),
        dp_sgd_min_records: int = _opt("dp_sgd_min_records", "--dp-sgd-min-records",
                                       help="fedhypevae runs its DP-SGD stage only where the median client has at "
                                            "least this many training records; below, the statistics release takes "
                                            "the whole ε (the no-dp-sgd model). 0: always run it. With "
                                            "--secure-aggregation the stage always runs (not measured there)."),
        hidden: Optional[int] = _opt("hidden", "--hidden", section="model",
                                     help="Width of the CVAE's hidden layers (model size)."),
        latent: Optional[str] = _opt("latent", "--latent", section="model", callback=auto_or_count, metavar="auto|INTEGER",
                                     help="Latent dimension L of z (model size; auto: 64 with DP, 128 with DP from 500 "
                                          "training records per class, the embedding dimension D without DP)."),
        method: str = _opt("method", "--method", help=_METHOD_HELP, click_type=choice(METHODS)),
        seed: Optional[int] = _opt("seed", "--seed", help="Reproducible run: the noise is seeded too (recorded as noise_seeded: true; whoever knows the seed can remove it)."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out."),
        set_: List[str] = typer.Option([], "--set", help="A [model] setting without a flag, model.key=value "
                                       "(repeatable, as `fedhype run --set`), e.g. model.client_shrinkage=client-cov, "
                                       "model.located_share=0.8."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Train the hypernetwork CVAE across clients; only clipped+noised updates leave a client.

        Every default is `fedhype run`'s (the train and model sections of its job configuration,
        fedhype.pipeline.config.DEFAULTS), so with no options this trains the model the main job trains.
        """

        def body() -> dict:
            from fedhype.data.partition import Partition
            from fedhype.data.store import EmbeddingStore
            from fedhype.federated.engine import train, train_sites

            check_out_dir(out, "train", "give a new folder, or an existing run directory with --resume")
            check_out_kind(out, "train", ("run",))  # never into a job, a model or a folder of other files
            given = {name for name in ("epsilon", "noise_multiplier")
                     if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
            if given == {"epsilon", "noise_multiplier"}:
                raise ValidationError("--epsilon asks σ to be calibrated for a target ε and --noise-multiplier sets σ "
                                      "directly; give one of the two (with --noise-multiplier ε is what the accountant says)")
            if no_dp:
                for name, flag in (("epsilon", "--epsilon"), ("noise_multiplier", "--noise-multiplier"),
                                   ("max_epsilon", "--max-epsilon")):
                    if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE":
                        raise ValidationError(f"{flag} asks for privacy but --no-dp turns it off; drop one of the two")
            cfg = build_config(dict(rounds=rounds, local_epochs=local_epochs, local_steps=local_steps,
                                    batch_size=batch_size, participation=participation, lr_local=lr_local,
                                    epsilon=epsilon, delta=delta, noise_multiplier=noise_multiplier,
                                    clip_norm=clip_norm, class_stats_share=class_stats_share, second_moment_share=second_moment_share,
                                    centre_share=centre_share, release_radius=release_radius,
                                    release_centre=release_centre, secure_aggregation=secure_aggregation, dropout_tolerance=dropout_tolerance,
                                    class_stats_noise_multiplier=class_stats_noise_multiplier, no_dp=no_dp, max_epsilon=max_epsilon, seed=seed,
                                    min_records=min_records, dp_sgd_min_records=dp_sgd_min_records, method=method),
                               {"hidden": hidden, "latent": latent, **model_settings(set_, **{
                                   n: v for n, v in (("hidden", hidden), ("latent", latent))  # only flags given
                                   if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"})})
            sites = _sites(store, partition, site, classes)
            if seed is not None and not no_dp:  # said before anything is spent
                warn(seeded_note(sites is not None))
            if sites is None:
                s = EmbeddingStore.load(store)
                if s.kind != "real":  # before the partition check, whose digest mismatch would hide the cause
                    raise ArtifactError(f"--store {store} is a {s.kind!r} store; `fedhype train` trains on real "
                                        "embeddings (from `fedhype embed`)")
                p = Partition.load(partition)
            sizes = ({s_.name: len(s_.split.train) for s_ in sites} if sites is not None
                     else {c.name: len(c.train) for c in p.clients})
            # fedhypevae without its DP-SGD stage for small clients (public sizes; docs/method.md, decision 22), as
            # the engine resolves it: the header, the resume checks and the advice below are about the run that runs
            from fedhype.federated.rundir import RunDir
            from fedhype.federated.run_plan import recorded_config, resolve_stage

            given = cfg
            cfg = resolve_stage(cfg, sizes, recorded_config(RunDir(out), resume) if (out / "config.json").exists() else None)
            sigma0 = cfg.class_stats_noise_multiplier or cfg.noise_multiplier  # a statistics-only run's one σ (a probe)
            privacy = ("NON-PRIVATE" if cfg.no_dp else f"release σ₀ = {sigma0:g}" if cfg.statistics_only and sigma0
                       else f"σ = {cfg.noise_multiplier:g}" if cfg.noise_multiplier is not None
                       else f"target ε = {cfg.epsilon:g}")
            m = len(sites) if sites is not None else len(p.clients)
            what = ("the statistics release alone (no DP-SGD round)" if cfg.statistics_only else
                    f"{cfg.rounds} round{'s' if cfg.rounds != 1 else ''}")  # dp-gaussian said "8 rounds", ran 0 (a probe)
            if resume and (out / "config.json").exists():  # before any line about the run: a refusal is the only word
                from fedhype.federated.rundir import RunDir
                from fedhype.federated.run_plan import check_resumed_settings, check_resumed_sites, recorded_config

                recorded = recorded_config(RunDir(out), True)
                check_resumed_sites(RunDir(out), recorded, [s_.name for s_ in sites] if sites is not None else None)
                check_resumed_settings(RunDir(out), cfg, recorded)
            from fedhype.federated.run_plan import finished_run

            finished = finished_run(out, cfg) if resume else None
            if finished is not None:
                # a probe's --resume --max-epsilon 0.1 of a finished run was refused for the ε of the whole plan: nothing
                # is left to run, so nothing is spent and the cap has nothing to stop (the settings are still checked)
                eps = finished["epsilon"]
                spent = "not private (--no-dp)" if eps is None else f"ε = {eps:.4g} at δ = {finished['delta']:g}"
                cap = ""
                if cfg.max_epsilon is not None:
                    cap = (f"; --max-epsilon {cfg.max_epsilon:g} has nothing to stop"
                           + (" (the run's ε is above it already: spent before, when it was not capped)"
                              if eps is not None and eps > cfg.max_epsilon else ""))
                    import dataclasses

                    cfg = dataclasses.replace(cfg, max_epsilon=None)
                k = finished["planned"]
                what = f"its {k} round{'s' if k != 1 else ''}" if k else "its statistics release"
                log_line(f"train: the run in {out} is finished ({what}, {spent}): nothing to resume, nothing is spent"
                         f"{cap}; start a new run in another --out to train again")
            elif resume and (out / "config.json").exists():  # a refused resume printed the new settings first (a probe)
                from fedhype.federated.rundir import RunDir
                from fedhype.pipeline.job import release_resume_note

                log_line(f"train: resuming the run in {out} over {m} {'site' if sites else 'client'}{'s' if m != 1 else ''}; "
                         "only its recorded settings may resume it (a different one is refused before anything runs); "
                         + release_resume_note(RunDir(out).release_stage(), cfg.seed is not None))
            else:
                log_line(f"train: {what} over {m} {'site' if sites else 'client'}{'s' if m != 1 else ''} ({cfg.method}, "
                         f"{privacy}, δ = {cfg.delta:g})")
                if cfg is not given:
                    log_line(f"train: {given.stage_off_reason(sizes)}")
            # δ < 1/n is refused by the plan; δ ≪ 1/n is advised (as `fedhype budget` warns), and the rest — not for
            # a finished run, where nothing runs (a probe's --resume of one was warned about its batch size)
            for advice in given.plan_warnings(sizes) if finished is None else []:
                log_line(f"train: warning: {advice}")
            try:
                if sites is not None:
                    vocab = class_list(classes)
                    res = dict(train_sites(sites, cfg, out, classes=vocab, resume=resume,
                                           progress=round_printer(cfg.rounds)))
                else:
                    res = dict(train(s, p, cfg, out, resume=resume, progress=round_printer(cfg.rounds)))  # a TrainResult
            except ValidationError as exc:
                raise explain_min_records(
                    exc, records="--min-records",
                    partition=("more records at that site (its split: `fedhype site`)" if sites is not None else
                               "`fedhype partition --min-records {need}` with fewer --clients (or another --scheme)")) from None
            from fedhype.pipeline.report import above_target

            target = cfg.epsilon if res["private"] and cfg.noise_multiplier is None else None
            res["target_epsilon"] = target
            res["nothing_to_resume"] = finished is not None
            # a resumed run recharges the round that was interrupted: the accountant's ε then exceeds the target
            res["above_target"] = above_target(res["epsilon"], target)
            if json_out and res["above_target"]:  # stdout is the JSON object: say it on stderr too
                print_above_target(res)
            return res

        run_command(body, json_out, _render, interrupted=INTERRUPTED_TRAINING)
