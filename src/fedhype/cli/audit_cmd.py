"""``fedhype audit``: check a run's privacy claims — ledger consistency, membership inference, canaries.

* ``--run DIR``: verify the ledger and recompute ε (PRV; RDP cross-check); compare with every ε
  the run reports (model metadata, each round of metrics.json, report.json) and the
  ``--synthetic`` stores' metadata. A tampered ledger or any mismatch exits **4** (the JSON
  object is still printed, with ``"exit_code": 4``).
* ``--mia --store S --partition P``: DOMIAS and DCR membership inference on the run's
  synthetic data (members = train split, non-members = test split, reference = val split).
* ``--canaries white-box|black-box``: one-run audit (Steinke, Nasr & Jagielski 2023): an
  empirical ε lower bound at ``--confidence``. ``--release`` (white-box): canaries in the statistics
  release before round 0 as it ran — per client, or secure aggregation's honest sum, with Gaussian or
  Skellam noise (:mod:`fedhype.eval.canary_release`) — against the ε of the release alone. A bound above the claimed ε
  (``"exceeds_claim": true``, "EXCEEDS CLAIM") exits **4** with both figures in the error (the
  JSON object is still printed): the mechanism leaks more than the accountant claims, unless it
  is a false alarm, which a correct mechanism raises with probability at most 1 − confidence.

``--run`` takes a ``fedhype train`` run directory or a ``fedhype run`` output folder (the job's
training run is its ``run/``; the ledger check also reads the job's report.json and
synthetic.safetensors).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.choices import CANARIES, choice
from fedhype.cli.common import (
    JsonOpt, LineProgress, console, existing, kv_table, round_printer, run_command, seed_value, warn)
from fedhype.errors import ValidationError

#: the largest --tolerance: it absorbs rounding of recorded ε figures (a claim is consistent within it), nothing more
MAX_TOLERANCE = 0.01
_CANARY_KEYS = ("claimed_epsilon", "empirical_epsilon_lower_bound", "exceeds_claim", "n_canaries", "guesses", "correct")



def job_model(dim: int, n_classes: int, n_train: int | None = None, n_clients: int | None = None):
    """The model ``fedhype train`` / ``fedhype run`` build with their defaults (the job's ``[model]``
    and the default method's preset) for ``n_train`` training records over ``n_clients`` clients: what a
    white-box audit without ``--run`` replays (the latent size depends on the records per class,
    :func:`fedhype.models.config.resolve_latent`; the code dimension on the clients,
    :func:`fedhype.models.config.resolve_code_dim`)."""
    from fedhype.pipeline.config import resolve, train_config

    return train_config(resolve(None, [])).model_config(dim, n_classes, n_train=n_train, n_clients=n_clients)

def _fmt(v: Any) -> str:
    return "—" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))


def _render(r: dict[str, Any]) -> None:
    out = Console()
    if r.get("run") is not None:
        rows = {k: r.get(k) for k in ("run", "private", "ledger_ok", "epsilon", "epsilon_rdp", "delta", "worst_client",
                                      "events", "consistent") + (("target_epsilon", "above_target", "recharged_events")
                                                                  if r.get("target_epsilon") is not None else ())}
        names = r.get("client_names") or {}
        if r.get("worst_client") is not None and names.get(str(r["worst_client"]), str(r["worst_client"])) != str(r["worst_client"]):
            rows["worst_client"] = f"{r['worst_client']} ({names[str(r['worst_client'])]})"
        rows["claims checked"] = len(r.get("checked", []))
        rows["release folder"] = bool(r.get("release"))
        out.print(kv_table("ledger consistency (ε recomputed: PRV; RDP cross-check)", rows))
        if not r.get("release") and r.get("ledger_ok") is not False and r.get("dp_linear") is not True:
            console.print(f"[dim]note[/]: {_run_folder_note(r)}", highlight=False, soft_wrap=True)
        if r.get("mismatches"):
            t = Table(title="MISMATCHES", title_style="bold red")
            for col in ("name", "claimed", "recomputed", "difference", "reason"):
                t.add_column(col)
            for m in r["mismatches"]:
                t.add_row(*(_fmt(m.get(c)) for c in ("name", "claimed", "recomputed", "difference", "reason")))
            out.print(t)
        if r.get("sites"):  # a passing --site comparison showed nothing but one more claim checked (a probe)
            t = Table(title="the run's ledger against each site's own")
            for col in ("site", "run key", "events", "ε (run)", "ε (site)", "ok", "note"):
                t.add_column(col)
            notes: list[str] = []  # below the table: a sentence in a column wrapped it a word per line (a probe)
            for row in r["sites"]:
                site_eps = "∞" if row.get("infinite") and row.get("recomputed") is None else _fmt(row.get("recomputed"))
                if row.get("note"):
                    notes.append(f"[{len(notes) + 1}] {row['site']}: {row['note']}")
                t.add_row(str(row["site"]), str(row["run_key"]), str(row["events"]), _fmt(row["claimed"]), site_eps,
                          "yes" if row["ok"] else "NO", f"[{len(notes)}]" if row.get("note") else "")
            out.print(t)
            for n in notes:
                out.print(n, highlight=False, soft_wrap=True, markup=False)
        for w in r.get("warnings", []):
            warn(w)
    for mia in r.get("mia") or []:
        t = Table(title=f"membership inference ({mia['synthetic']})")
        for col in ("attack", "AUROC", "95% CI", "TPR@1%FPR"):
            t.add_column(col)
        for a in ("domias", "dcr"):
            if mia.get(a):
                ci = mia[a]["auroc_ci"]
                t.add_row(a, _fmt(mia[a]["auroc"]), "—" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
                          _fmt(mia[a]["tpr_at_1pct_fpr"]))
        out.print(t)
    can = r.get("canary")
    if can:
        out.print(kv_table(f"canary audit ({can['mode']})", {k: can.get(k) for k in (
            *_CANARY_KEYS, "n_included", "confidence", "delta", "breakage", "steps", "output_privacy")}))
        if can["exceeds_claim"]:
            console.print("[bold red]EXCEEDS CLAIM[/]: the empirical lower bound is above the claimed ε", highlight=False)


def _run_folder_note(r: dict[str, Any]) -> str:
    """What ``release folder: False`` means for the folder audited (a run's, as a data holder audits it), and which
    folder may be shared instead (a probe found the first wording hard to parse and pointing a seeded run's holder
    to a release that must not leave the site)."""
    note = ("release folder: False is expected for a run folder: it holds private files beside the DP outputs and "
            "never leaves the site. ")
    job = r.get("job_release")
    if not r.get("private") or r.get("noise_seeded"):
        return note + ("This run's release must not leave the site as private data either (the warnings above say "
                       "why).")
    if r.get("interrupted"):
        return note + "Its release is written when the run completes (resume it); audit that folder before sharing it."
    where = f"{job}" if job else "the folder `fedhype synthesize --run RUN --release DIR` writes"
    return note + f"What may be shared is its release, {where}: audit that folder before sharing it."


def exceeds_claim_message(can: dict[str, Any]) -> str:
    """The exit-4 message of a canary audit whose empirical ε lower bound is above the claimed ε."""
    broken = (f" (--break {can['breakage']}: a deliberately broken mechanism, detected as intended)"
              if can.get("breakage") else "")
    return (f"canary audit ({can['mode']}): the empirical ε lower bound {can['empirical_epsilon_lower_bound']:.4g} "
            f"exceeds the claimed ε {can['claimed_epsilon']:.4g} (δ = {can['delta']:g}; {can['correct']} of "
            f"{can['guesses']} guesses correct, {can['n_canaries']} canaries, confidence {can['confidence']:g}): the "
            f"mechanism leaks more than the accountant claims, or this is a false alarm (probability at most "
            f"{1 - can['confidence']:.2g} for a correct mechanism){broken}")


def _load_data(store: Optional[Path], partition: Optional[Path]):
    from fedhype.data.partition import Partition
    from fedhype.data.store import EmbeddingStore

    s = EmbeddingStore.load(store) if store is not None else None
    p = Partition.load(partition) if partition is not None else None
    return s, p


def _n_train(s, p) -> int:
    """The training records a job on store ``s`` would train on: the partition's training splits, or
    (without ``--partition``) the store's records."""
    if p is not None:
        return sum(c.n_train for c in p.clients)
    return len(s)


def _white_box(run, s, p, client, sigma, q, steps, clip, delta, opts: dict) -> dict:
    from fedhype.eval.audit_ledger import run_directory
    from fedhype.eval.audit_mia import check_run_data
    from fedhype.eval.canary import MechanismPhase, default_model, run_mechanism, white_box_audit

    given = {"--noise-multiplier": sigma, "--sample-rate": q, "--steps": steps}
    if any(v is not None for v in given.values()) and any(v is None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        raise ValidationError(f"white-box canaries: give all of --noise-multiplier, --sample-rate, --steps (missing {missing}) "
                              "or none of them to replay the run's ledger")
    if clip is not None and sigma is None:
        raise ValidationError("--clip-norm goes with --noise-multiplier, --sample-rate and --steps")
    if run is not None:
        mech = run_mechanism(run_directory(run), client)
    elif s is not None:
        model = job_model(s.dim, s.n_classes, n_train=_n_train(s, p), n_clients=None if p is None else len(p.clients))
        cfg, theta = default_model(s.dim, s.n_classes, opts["seed"], cfg=model)
        mech = {"client": client or "0", "phases": None, "delta": None, "model_cfg": cfg, "theta": theta}
    else:
        raise ValidationError("white-box canaries need --run (model and mechanism) or --store (data) with "
                              "--noise-multiplier/--sample-rate/--steps")
    if sigma is not None:
        mech["phases"] = [MechanismPhase(sigma, q, steps, clip if clip is not None else 1.5)]
    elif mech["phases"] is None:
        raise ValidationError("without --run, give --noise-multiplier, --sample-rate and --steps")
    records = None
    if s is not None and p is not None:
        if run is not None:
            check_run_data(run_directory(run), s, p)
        tr = p.client_store(s, int(mech["client"]), "train")
        records = (tr.embeddings, tr.labels)
    else:
        warn("no --store/--partition: the mechanism runs on the canaries alone", "note")
    total = sum(ph.steps for ph in mech["phases"])
    console.print(f"white-box audit: client {mech['client']}, {total} DP steps, {opts['n_canaries']} canaries …",
                  highlight=False)
    lines = LineProgress("audit: white-box DP steps", total, "steps")
    res = white_box_audit(mech["phases"], delta=delta if delta is not None else (mech["delta"] or 1e-4),
                          model_cfg=mech["model_cfg"], theta=mech["theta"], records=records,
                          progress=lambda done, _total: lines.update(done - lines.done), **opts)
    res["client"] = mech["client"]
    return res


def _release_box(run, s, p, client, opts: dict) -> dict:
    """``--canaries white-box --release``: record canaries in the statistics release (:mod:`fedhype.eval.canary_release`)."""
    from fedhype.eval.audit_ledger import run_directory
    from fedhype.eval.audit_mia import check_run_data
    from fedhype.eval.canary_release import release_audit, release_mechanism

    if run is None:
        raise ValidationError("--release audits a run's statistics release: give --run")
    mech = release_mechanism(run_directory(run), client)
    records = None
    if s is not None and p is not None:
        check_run_data(run_directory(run), s, p)
        tr = p.client_store(s, int(mech["client"]), "train")
        records = (tr.embeddings, tr.labels)
    else:
        warn("no --store/--partition: the release runs on the canaries alone", "note")
    n = opts.pop("n_canaries") or mech["dim"]
    sa = mech["distributed"]
    console.print(f"white-box release audit: client {mech['client']}, {len(mech['steps'])} step(s)"
                  + (f", secure aggregation m = {sa.clients}, t = {sa.dropout_tolerance}" if sa is not None else "")
                  + f", {n} canaries …", highlight=False)
    return release_audit(mech, records=records, n_canaries=n, **opts)


def _black_box(run, s, p, client, audit_out, opts: dict) -> dict:
    from fedhype.eval.audit_ledger import run_directory
    from fedhype.eval.canary_blackbox import black_box_audit
    from fedhype.federated.config import TrainConfig
    from fedhype.io import read_json

    if run is None or s is None or p is None:
        raise ValidationError("black-box canaries need --run (its training configuration), --store and --partition")
    train = dict(read_json(run_directory(run) / "config.json", "run config")["train"])
    cfg = TrainConfig(**train)
    console.print(f"black-box audit: training a run with {opts['n_canaries']} input canaries in client "
                  f"{client or '0'} …", highlight=False)
    return black_box_audit(s, p, cfg, audit_out, client=int(client or 0), progress=round_printer(cfg.rounds), **opts)


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit_cmd(
        run: Optional[Path] = typer.Option(None, "--run", help="Run directory to audit (ledger consistency).",
                                           callback=existing("run directory", "a `fedhype train` run or `fedhype run` output",
                                                             kind="dir")),
        synthetic: Optional[list[Path]] = typer.Option(None, "--synthetic", help="Synthetic store drawn from the run (repeatable): its ε is checked; --mia attacks it.",
                                                      callback=existing("synthetic embeddings store", "create it with `fedhype synthesize`")),
        tolerance: float = typer.Option(1e-6, "--tolerance", help="Allowed |claimed − recomputed| ε, in [0, 0.01] (rounding only)."),
        mia: bool = typer.Option(False, "--mia", help="Membership inference (needs --store and --partition)."),
        store: Optional[Path] = typer.Option(None, "--store", help="The run's real embeddings store.",
                                             callback=existing("embeddings store", "create it with `fedhype embed`")),
        partition: Optional[Path] = typer.Option(None, "--partition", help="The run's partition.",
                                                 callback=existing("partition file", "create it with `fedhype partition`")),
        per_class: Optional[int] = typer.Option(None, "--per-class", help="--mia without --synthetic: samples per class to draw."),
        canaries: Optional[str] = typer.Option(None, "--canaries", help="white-box | black-box one-run canary audit.",
                                                click_type=choice(CANARIES)),
        n_canaries: Optional[int] = typer.Option(None, "--n-canaries", help="Number of canaries m (default 1000; "
                                                 "with --release D, one per embedding coordinate)."),
        release: bool = typer.Option(False, "--release", help="White-box: canary records in the statistics release "
                                     "before round 0 as it ran (per client, or secure aggregation's sum, Gaussian or "
                                     "Skellam) instead of the DP-SGD steps."),
        noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier", help="White-box: σ (default: the run's ledger)."),
        sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="White-box: Poisson rate q."),
        steps: Optional[int] = typer.Option(None, "--steps", help="White-box: number of DP steps."),
        clip_norm: Optional[float] = typer.Option(None, "--clip-norm", help="White-box: C (default 1.5)."),
        delta: Optional[float] = typer.Option(None, "--delta", help="δ of the claim (default: the run's, else 1e-4)."),
        client: Optional[str] = typer.Option(None, "--client", help="Client to audit (default: the worst client / 0)."),
        breakage: Optional[str] = typer.Option(None, "--break", help="TEST ONLY: run a broken mechanism (noise | clipping) to demonstrate detection."),
        guess_in: float = typer.Option(0.1, "--guess-in", help="Fraction of canaries guessed 'in' (top scores)."),
        guess_out: float = typer.Option(0.0, "--guess-out", help="Fraction of canaries guessed 'out' (bottom scores)."),
        confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the ε lower bound."),
        audit_out: Optional[Path] = typer.Option(None, "--out", "--audit-out", help="Black-box: keep the canary run in this folder "
                                                "(--out, as in every command; --audit-out is its earlier name)."),
        seed: int = typer.Option(0, "--seed", callback=seed_value, help="Seed of canaries, sampling, attacks."),
        sites_dirs: Optional[list[Path]] = typer.Option(None, "--site", help="With --run (a run over sites): a site "
                                                        "folder whose own ledger across runs is compared with the run's "
                                                        "ledger (repeatable): the run must not report less ε for the "
                                                        "site's client than the site recorded for the run."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Audit privacy claims: recompute ε from the ledger, attack the synthetic data, bound ε with canaries."""
        state: dict[str, Any] = {}

        def body() -> dict[str, Any]:
            from fedhype.data.store import EmbeddingStore
            from fedhype.eval.audit_ledger import audit_run
            from fedhype.eval.audit_mia import run_mia

            if run is None and canaries is None:
                raise ValidationError("nothing to audit: give --run DIR and/or --canaries")
            if run is not None and not any((run / f).exists() for f in ("model.safetensors", "config.json",
                                                                        "ledger.json", "run")):
                raise ValidationError(f"--run {run} is not a run directory (no model.safetensors, config.json or "
                                      "ledger.json, no run/ folder): give the --out of `fedhype train` or `fedhype run`")
            if run is not None:  # a helper's audit of a run still training read it half-way and said "tampered"
                from fedhype.federated.rundir import RunDir

                RunDir(run).refuse_if_training("audit it")
            if not (math.isfinite(tolerance) and 0.0 <= tolerance <= MAX_TOLERANCE):
                # `--tolerance 5` passed a privacy.json edited from ε 2.005 to 1.0 as consistent (a probe)
                raise ValidationError(f"--tolerance must be a number in [0, {MAX_TOLERANCE:g}] (it absorbs the rounding of "
                                      f"recorded ε figures, not a difference in budget), got {tolerance!r}")
            if canaries is None:  # a probe's --delta / --n-canaries without --canaries were ignored without a word
                stray = [name for name, v in (("--n-canaries", n_canaries), ("--noise-multiplier", noise_multiplier),
                                              ("--sample-rate", sample_rate), ("--steps", steps), ("--clip-norm", clip_norm),
                                              ("--delta", delta), ("--client", client), ("--out", audit_out))
                         if v is not None]
                stray += [name for name, v, default in (("--guess-in", guess_in, 0.1), ("--guess-out", guess_out, 0.0),
                                                        ("--confidence", confidence, 0.95)) if v != default]
                if stray:
                    raise ValidationError(f"{', '.join(stray)}: {'these apply' if len(stray) > 1 else 'this applies'} to a "
                                          "canary audit only; add --canaries white-box or --canaries black-box, or leave "
                                          f"{'them' if len(stray) > 1 else 'it'} out (the ledger check and --mia use the "
                                          "run's own δ)")
            if mia and run is not None:  # before the store is read: a site run has none (a probe was told of digests)
                from fedhype.eval.audit_mia import run_sites, site_run_refusal

                sites = run_sites(run)
                if sites:
                    raise site_run_refusal(run, sites)
                from fedhype.pipeline.release import is_release

                if is_release(run):  # a helper's --mia on a release "is not the one … trained on (digest None…)"
                    raise ValidationError(f"--mia --run {run}: a release folder names no store (it carries no record "
                                          "ids and no store digest, by design), so the attack cannot check that --store "
                                          "and --partition are the run's; give --run the run folder it was released "
                                          "from (the job folder or its run/), where the store is")
            if canaries not in (None, "white-box", "black-box"):
                raise ValidationError(f"--canaries must be white-box or black-box, got {canaries!r}")
            if breakage is not None and canaries != "white-box":
                raise ValidationError("--break applies to --canaries white-box only")
            if release and canaries != "white-box":
                raise ValidationError("--release applies to --canaries white-box only")
            if release and breakage not in (None, "noise"):
                raise ValidationError(f"--release --break: only 'noise' (the release has no clipping to break), got {breakage!r}")
            if canaries is not None:  # checked before a mechanism is run or a run is trained
                from fedhype.eval.canary_bound import guess_counts

                if n_canaries is not None and n_canaries < 1:
                    raise ValidationError(f"--n-canaries must be ≥ 1, got {n_canaries}")
                if not 0.0 < confidence < 1.0:
                    raise ValidationError(f"--confidence must be in (0, 1), got {confidence:g}")
                if n_canaries is not None or not release:
                    guess_counts(n_canaries or 1000, guess_in, guess_out)
            res: dict[str, Any] = audit_run(run, synthetic or [], tolerance) if run is not None else {"run": None}
            if run is not None:
                from fedhype.pipeline.release import is_release

                res["release"] = is_release(run)  # also where its ledger failed to load (a recipient's probe)
            if run is not None and res.get("ledger_ok") is not False:
                from fedhype.eval.audit_ledger import is_job_dir
                from fedhype.pipeline.release import check_release

                rows = check_release(run, tolerance)  # a release folder: its privacy.json, digests and README
                if is_job_dir(run) and (Path(run) / "release" / "privacy.json").is_file():
                    res["job_release"] = str(Path(run) / "release")  # named by the note on a run folder's audit
                if rows is not None:
                    res["release"] = True
                    res["checked"] += rows
                    res["mismatches"] += [{k: v for k, v in r.items() if k != "ok"} for r in rows if not r["ok"]]
                    res["consistent"] = not res["mismatches"]
            if sites_dirs and run is None:
                raise ValidationError("--site compares a run's ledger with the sites' own: give --run DIR too")
            if sites_dirs and res.get("ledger_ok") is not False:
                from fedhype.eval.audit_sites import compare_site

                rows = [compare_site(run, d, tolerance) for d in sites_dirs]
                res["sites"] = rows
                res["checked"] += rows
                res["mismatches"] += [{k: v for k, v in r.items() if k != "ok"} for r in rows if not r["ok"]]
                res["consistent"] = not res["mismatches"]
            s, p = _load_data(store, partition)
            if mia:
                if run is None or s is None or p is None:
                    raise ValidationError("--mia needs --run, --store and --partition")
                syns = [EmbeddingStore.load(x) for x in synthetic or []] or [None]
                res["mia"] = [{**run_mia(run, s, p, x, per_class=per_class, seed=seed),
                               **({"synthetic": str(path)} if x is not None else {})}
                              for x, path in zip(syns, synthetic or [None])]
            if canaries is not None:
                opts = dict(n_canaries=n_canaries if (n_canaries is not None or release) else 1000, guess_in=guess_in,
                            guess_out=guess_out, confidence=confidence, seed=seed)
                if canaries == "white-box" and release:
                    can = _release_box(run, s, p, client, {**opts, "breakage": breakage})
                elif canaries == "white-box":
                    can = _white_box(run, s, p, client, noise_multiplier, sample_rate, steps, clip_norm, delta,
                                     {**opts, "breakage": breakage})
                else:
                    can = _black_box(run, s, p, client, audit_out, opts)
                res["canary"] = can
                res.update({k: can[k] for k in _CANARY_KEYS})
            errors = []
            if run is not None and not res["consistent"]:
                errors.append("ledger verification failed: " + str(res["ledger_error"])
                              + ("; if this release folder was sent to you, ask its sender for the folder as released"
                                 if res.get("release") else "") if res["ledger_ok"] is False
                              else f"{len(res['mismatches'])} reported figure(s) or file(s) disagree with the ledger "
                              "or the release's digests: "
                              + "; ".join(m["name"] for m in res["mismatches"]))
            if res.get("canary") and res["canary"]["exceeds_claim"]:
                errors.append(exceeds_claim_message(res["canary"]))
            if errors:
                res.update(exit_code=4, kind="artifact", error="; ".join(errors))
            state["res"] = res
            return res

        run_command(body, json_out, _render)
        res = state.get("res") or {}
        if res.get("exit_code") == 4:
            console.print(f"[bold red]error[/]: {res['error']}", highlight=False, soft_wrap=True)
            raise typer.Exit(4)
