"""``fedhype budget``: ε for a mechanism or a federated plan, or σ for a target ε.

Single mechanism: ``--noise-multiplier S --sample-rate Q --steps T --delta D`` → ε by PRV, RDP and
PLD; the reported ``"epsilon"`` is the smaller of the PRV and RDP upper bounds (``"accountant"``
names which), and a disagreement beyond the accountants' tolerances is listed in ``"warnings"``
(:func:`fedhype.privacy.accountant.cross_check`). ``--epsilon E`` instead of ``--noise-multiplier``
→ the σ whose reported ε ≤ E.

Federated plan: ``--rounds R [--local-epochs E | --local-steps K] --batch-size B
(--client-sizes N1,N2,… | --partition PART.json | --card CARD ...) [--participation P]``. Per client i with n_i
training records: q_i = min(1, B / n_i) (Poisson sampling, expected batch B), local steps per round
K or max(1, ⌈E·n_i / B⌉) (``TrainConfig.steps_per_round``, what ``fedhype train`` runs; E may be
fractional), and steps_i = R · local steps: as ``fedhype train`` calibrates it
(:func:`fedhype.federated.run_plan.plan_privacy`), a client may be drawn in every round, so σ
binds for any draw; no amplification from client sampling is claimed. With P < 1 a client takes
part in about ⌈P·R⌉ rounds (``expected_rounds_per_client``) and the run's ledger counts only those,
so its ε ends below the plan's. (The plan had assumed ⌈P·R⌉ rounds per client, a σ smaller than
the one ``train`` uses: 14.8 against 20.5 for 12 rounds at P = 0.5.) ε per client and the worst client are reported (each client row has its
``accountant`` and ``warnings``; the top-level ``warnings`` collect them, prefixed with the client);
with ``--epsilon`` the common σ is the smallest for which every client stays ≤ E (the worst client
binds). δ ≥ 1/min n_i, ``--rounds`` < 1 and ``--local-steps``/``--local-epochs`` < 1 are refused.

An infinite ε (σ = 0: no noise, so no differential-privacy guarantee at any ε) is reported as
``"epsilon": null`` with ``"epsilon_infinite": true`` and a ``"note"`` in JSON (strict JSON has no
∞), and as ``ε = ∞`` in the table; ``"epsilon_infinite"`` is present (false) in every result.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.common import (
    JobDefaultsCommand, JsonOpt, config_default, console, existing, kv_table, run_command, warn)
from fedhype.errors import ValidationError

INFINITE_NOTE = "ε = ∞: σ = 0 adds no noise, so there is no differential-privacy guarantee"


def _infinite(eps: Any) -> bool:
    return isinstance(eps, float) and math.isinf(eps)


def _mark(result: dict[str, Any], sigma: float, note: bool = True) -> dict[str, Any]:
    """Add ``epsilon_infinite`` (and, with ``note``, a ``note`` saying why when it is true)."""
    result["epsilon_infinite"] = _infinite(result.get("epsilon"))
    if result["epsilon_infinite"] and note:
        result["note"] = INFINITE_NOTE if sigma == 0 else \
            "ε = ∞: the accountant finds no finite ε for this mechanism (no differential-privacy guarantee)"
    return result


#: a δ at or above this gets a warning from a single mechanism's budget (no n to compare it with)
LARGE_DELTA = 0.01


def budget_single(delta: float, sample_rate: float, steps: int, noise_multiplier: float | None = None,
                  target_epsilon: float | None = None) -> dict[str, Any]:
    """ε of ``steps`` Poisson-subsampled Gaussian steps, or (with ``target_epsilon``) σ for a target ε."""
    from fedhype.privacy.accountant import epsilon_report, validate_delta, validate_noise_multiplier, validate_sample_rate, validate_steps  # torch: imported on use, not for --help
    from fedhype.privacy.plan import single_noise

    delta = validate_delta(delta, "--delta")
    q = validate_sample_rate(sample_rate, "--sample-rate")
    steps = validate_steps(steps, "--steps")
    if target_epsilon is not None:
        sigma = single_noise(target_epsilon, delta, q, steps)
    else:
        sigma = validate_noise_multiplier(noise_multiplier, "--noise-multiplier")
    rep = epsilon_report([(sigma, q, steps)], delta)
    out = {"mode": "single", **rep, "noise_multiplier": sigma, "sample_rate": q}
    if delta >= LARGE_DELTA:  # a probe's --delta 0.5 printed ε = 0 without a word
        out["warnings"] = [*(out.get("warnings") or []),
                           f"δ = {delta:g} is no meaningful guarantee: (ε, δ)-DP allows a mechanism that publishes a "
                           "record outright with probability δ; δ is usually well below 1/n of the data set (a plan "
                           "with --client-sizes checks it against each client's n)"]
    if target_epsilon is not None:
        out["target_epsilon"] = float(target_epsilon)
    return _mark(out, sigma)


def budget_plan(delta: float, rounds: int, batch_size: int, clients: list[tuple[str, str, int]],
                local_epochs: int | None = None, local_steps: int | None = None, participation: float = 1.0,
                noise_multiplier: float | None = None, target_epsilon: float | None = None,
                class_stats_share: float = 0.0, class_stats_noise_multiplier: float | None = None,
                secure_aggregation: bool = False, dropout_tolerance: int = 0, centre_share: float | None = None,
                dp_sgd_min_records: int | None = None) -> dict[str, Any]:
    """Per-client ε of a federated DP-SGD plan (see the module docstring).

    With ``class_stats_share > 0`` the plan includes the DP class statistics that ``fedhype train``
    releases once per client before round 0 (one un-subsampled Gaussian step of σ₀, composed first):
    with a target ε, σ₀ is calibrated so the release alone costs ``class_stats_share × ε`` and σ so
    that both compose to ε — exactly what ``fedhype train --epsilon`` does; with an explicit σ,
    σ₀ is ``class_stats_noise_multiplier`` or calibrated as ``fedhype train --noise-multiplier`` does.
    With ``centre_share`` s > 0 the release is centred as train's (:mod:`fedhype.privacy.centring`):
    two steps, σ₀/√s and σ₀/√(1 − s), which compose to the cost of one at σ₀ (default: train's s).

    With ``secure_aggregation`` the release's noise is split over the m clients
    (:class:`fedhype.privacy.secure_agg.DistributedNoise` ``(m, t)``): ε is unchanged (the sum is
    guaranteed to carry σ₀), and the result's ``secure_aggregation`` entry gives each client's share
    of the noise std, σ₀/√(m − t).

    Where ``fedhype train`` would run no DP-SGD round with these sizes (the median client below
    ``dp_sgd_min_records``, train's default when None; ``docs/method.md`` decision 22) the result's
    ``default_run`` gives the run train makes instead — the statistics release alone, its σ₀ and ε — and the
    rows stay the plan with the DP-SGD stage (``fedhype train --dp-sgd-min-records 0``); 0 plans the stage
    without that note.

    Args:
        clients: ``[(id, name, n_train), ...]``.

    Raises:
        ValidationError: a bad flag value, named by its option.
    """
    from fedhype.privacy.accountant import check_delta, delta_advice, epsilon_report, subsampling_advice, validate_delta, validate_noise_multiplier, validate_sample_rate, validate_steps  # torch: imported on use, not for --help
    from fedhype.privacy.plan import plan_noise

    delta = validate_delta(delta, "--delta")
    if not (isinstance(rounds, int) and not isinstance(rounds, bool) and rounds < 1):  # < 1: the message below
        rounds = validate_steps(rounds, "--rounds")
    if rounds < 1:
        raise ValidationError(f"--rounds must be ≥ 1, got {rounds}: `fedhype budget` plans DP-SGD rounds after the "
                              "statistics release; a method without rounds (`--method dp-gaussian` or `no-dp-sgd`) "
                              "spends the whole ε on that one release, at the σ₀ `fedhype train` prints")
    if (local_epochs is None) == (local_steps is None):
        raise ValidationError("give exactly one of --local-epochs or --local-steps")
    local_flag = "--local-epochs" if local_steps is None else "--local-steps"
    if local_steps is None:
        if isinstance(local_epochs, bool) or not isinstance(local_epochs, (int, float)) or not (
                math.isfinite(local_epochs) and local_epochs > 0):
            raise ValidationError(f"--local-epochs must be a number > 0, got {local_epochs!r}")
        local_n = float(local_epochs)
    else:
        local_n = validate_steps(local_steps, local_flag)
        if local_n < 1:
            raise ValidationError(f"{local_flag} must be ≥ 1, got {local_n}: a round without local steps runs no DP step")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValidationError(f"--batch-size must be an integer ≥ 1, got {batch_size!r}")
    p = validate_sample_rate(participation, "--participation")
    if not clients:
        raise ValidationError("the plan has no clients; give --client-sizes or --partition")
    # train's calibration (run_plan.plan_privacy): every round, since a client may be drawn in each of them
    rounds_per_client, expected_rounds = rounds, math.ceil(p * rounds - 1e-9)
    rows = []
    for cid, name, n in clients:
        check_delta(delta, n, f"client {cid}" + (f" ({name!r}, {n} training records)" if name not in (cid, f"client {cid}") else
                                                   f" ({n} training records)"))
        # the engine's own rule (TrainConfig.steps_per_round / sample_rate), so budget and train agree
        per_round = max(1, math.ceil(local_n * n / batch_size)) if local_steps is None else local_n
        rows.append({"client": cid, "name": name, "n": n, "sample_rate": min(1.0, batch_size / n),
                     "steps": rounds_per_client * per_round})
    if not (0 <= class_stats_share < 1):
        raise ValidationError(f"--class-stats-share must be in [0, 1) (0: no class-statistics release), got {class_stats_share}")
    from fedhype.privacy.centring import DEFAULT_CENTRE_SHARE

    plan = [(r["sample_rate"], r["steps"]) for r in rows]
    if target_epsilon is None:
        noise_multiplier = validate_noise_multiplier(noise_multiplier, "--noise-multiplier")
    centre_share = DEFAULT_CENTRE_SHARE if centre_share is None else centre_share
    # the privacy core's plan, as `fedhype train` calibrates it (fedhype.federated.engine.plan_privacy)
    noise = plan_noise(plan, delta, target_epsilon=target_epsilon, noise_multiplier=noise_multiplier,
                       release_share=class_stats_share, release_sigma=class_stats_noise_multiplier,
                       centre_share=centre_share)
    sigma, s0, prefix = noise["noise_multiplier"], noise["class_stats_noise_multiplier"], noise["prefix"]
    warnings: list[str] = []
    advice = delta_advice(delta, {r["name"]: r["n"] for r in rows})
    if advice:
        warnings.append(advice)
    full = subsampling_advice(batch_size, {r["name"]: r["n"] for r in rows})
    if full:  # q = min(1, B/n) = 1: no subsampling, so no amplification (a new user's probe: no word of it)
        warnings.append(full)
    from fedhype.federated.config import TrainConfig

    if dp_sgd_min_records is None:
        off_cfg = TrainConfig(secure_aggregation=bool(secure_aggregation))
    else:
        if isinstance(dp_sgd_min_records, bool) or not isinstance(dp_sgd_min_records, int) or dp_sgd_min_records < 0:
            raise ValidationError(f"--dp-sgd-min-records must be an integer ≥ 0 (0: always run the DP-SGD stage), got "
                                  f"{dp_sgd_min_records!r}")
        off_cfg = TrainConfig(secure_aggregation=bool(secure_aggregation), dp_sgd_min_records=dp_sgd_min_records)
    off = off_cfg.stage_off_reason([r["n"] for r in rows])
    default_run = None
    if off:  # train's default method would not run the rounds this plans (docs/method.md, decision 22)
        alone = ""
        # the σ₀ train will release at, and its ε: the run train makes by default, said before this plan's table (a
        # probe read this plan's σ and steps as the run's, with train's σ₀ only in a trailing warning)
        off_noise = plan_noise(plan, delta, target_epsilon=target_epsilon, noise_multiplier=noise_multiplier,
                               release_sigma=class_stats_noise_multiplier, centre_share=centre_share, release_only=True)
        s0_off = float(off_noise["class_stats_noise_multiplier"])
        default_run = {"statistics_only": True, "class_stats_noise_multiplier": s0_off,
                       "epsilon": epsilon_report(off_noise["prefix"], delta)["epsilon"], "reason": off,
                       "release_steps": [list(st) for st in off_noise["prefix"]]}
        if target_epsilon is not None and class_stats_noise_multiplier is None:
            alone = f" (by default train releases the statistics alone at σ₀ = {s0_off:.4g} for ε = {target_epsilon:g})"
        warnings.append(f"with these sizes `fedhype train` runs no DP-SGD round by default: {off}; this plan is that "
                        f"of `fedhype train --dp-sgd-min-records 0`{alone}")
    for r in rows:
        rep = epsilon_report(prefix + [(sigma, r["sample_rate"], r["steps"])], delta)
        r.update({k: rep[k] for k in ("epsilon", "accountant", "epsilon_prv", "epsilon_rdp", "epsilon_pld", "warnings")})
        warnings += [f"{r['name']}: {w}" for w in rep["warnings"]]
        _mark(r, sigma, note=False)
    worst = max(rows, key=lambda r: r["epsilon"])
    out = {"mode": "plan", "epsilon": worst["epsilon"], "accountant": worst["accountant"], "warnings": warnings,
           "delta": delta,
           "noise_multiplier": sigma, "sample_rate": worst["sample_rate"], "steps": worst["steps"],
           **{k: worst[k] for k in ("epsilon_prv", "epsilon_rdp", "epsilon_pld")},
           "worst_client": worst["client"], "rounds": rounds, "rounds_per_client": rounds_per_client,
           "expected_rounds_per_client": expected_rounds,
           "participation": p, "batch_size": batch_size, "local_epochs": local_epochs, "local_steps": local_steps,
           "clients": rows, "class_stats_share": class_stats_share,
           "class_stats_noise_multiplier": float(s0) if prefix else None,
           "class_stats_epsilon": epsilon_report(prefix, delta)["epsilon"] if prefix else 0.0,
           "release_steps": [list(s) for s in prefix]}
    if secure_aggregation:
        from fedhype.privacy.secure_agg import DistributedNoise

        if not prefix:
            raise ValidationError("--secure-aggregation splits the noise of the statistics release; with "
                                  "--class-stats-share 0 the plan has none (methods dp-cvae, no-class-stats)")

        plan_t = DistributedNoise(len(rows), int(dropout_tolerance))
        out["secure_aggregation"] = {"clients": plan_t.clients, "dropout_tolerance": plan_t.dropout_tolerance,
                                     "min_contributions": plan_t.min_contributions,
                                     "client_noise_multiplier": float(s0) * plan_t.share_std_factor if prefix else None,
                                     "note": plan_t.describe()}
    elif dropout_tolerance:
        raise ValidationError("--dropout-tolerance applies to secure aggregation: add --secure-aggregation or drop it")
    if target_epsilon is not None:
        out["target_epsilon"] = float(target_epsilon)
    if default_run is not None:
        out["default_run"] = default_run  # what `fedhype train` runs with these sizes and no --dp-sgd-min-records
    return _mark(out, sigma)


def budget_site(folder: Path, max_epsilon: float | None = None, delta: float | None = None,
                no_cap: bool = False) -> dict[str, Any]:
    """A site's ledger across runs (:func:`fedhype.privacy.site_ledger.report`); with ``max_epsilon`` (or
    ``no_cap``) its cap is set (lifted) first, with ``delta`` its δ (below 1/n of its training records).

    A larger δ for a site with a cap is refused unless the cap is restated (``max_epsilon``): ε at a larger δ is
    smaller, so the same cap would admit more runs (:func:`fedhype.privacy.site_ledger.check_delta_change`). A δ
    with n·δ > 0.1 is warned about as `train` and plans are (:func:`fedhype.privacy.accountant.delta_advice`).

    Raises:
        ValidationError: no site there; a cap below what was spent; a δ not below 1/n; a larger δ under a cap
            without the cap restated.
        ArtifactError: a site ledger that is missing though started, corrupt, or another site's.
    """
    from fedhype.data.sites import SITE_FILE, Site
    from fedhype.privacy.site_ledger import KEEP, check_delta, check_delta_change, load_site_ledger, report, set_site_ledger

    if not (folder / SITE_FILE).is_file() and not (folder.is_file() and folder.suffix == ".json"):
        raise ValidationError(f"--site {folder}: no {SITE_FILE} there; give a site folder written by `fedhype site`")
    s = Site.load(folder)
    led = load_site_ledger(s.folder, expected=s.ledger, site=s.name)
    warnings: list[str] = []
    if max_epsilon is not None or no_cap or delta is not None:
        if delta is not None:
            from fedhype.privacy.accountant import delta_advice

            check_delta(delta, len(s.split.train))
            check_delta_change(led, delta, None if no_cap else (KEEP if max_epsilon is None else float(max_epsilon)))
            if (advice := delta_advice(delta, {s.name: len(s.split.train)})) is not None:
                warnings.append(advice)
                warn(advice)
        if led is None and delta is None:
            from fedhype.pipeline.config import DEFAULTS

            delta = check_delta(float(DEFAULTS["train"]["delta"]), len(s.split.train))
        before = led.delta if led is not None else None
        led = set_site_ledger(s.folder, s.name, max_epsilon=None if no_cap else (KEEP if max_epsilon is None else
                                                                                 float(max_epsilon)),
                              delta=delta, expected=s.ledger)
        if before is not None and before != led.delta:  # the site's policy changes: say so (ε is recomputed at it)
            console.print(f"site {s.name!r}: its ledger's δ changed from {before:g} to {led.delta:g}; every run's ε is "
                          "recomputed at it", highlight=False)
        from fedhype.federated.site_charges import mark_site_ledger

        mark_site_ledger(s)
    out = {"mode": "site", **report(led, s.folder, s.name)}
    if warnings:
        out["warnings"] = warnings
    return out


def _with_sites(plan: dict[str, Any], folders: list[Path]) -> dict[str, Any]:
    """``plan`` (from cards) with, per ``--site``, its ledger across runs composed with its share of the run `fedhype
    train` makes with these cards (the release and its planned rounds; the release alone where the plan's
    ``default_run`` says train runs no DP-SGD round) at the site's δ: what the site would have spent, and whether its
    cap holds (what `train --site` and the site's SuperNode would refuse)."""
    from fedhype.data.sites import Site
    from fedhype.privacy.ledger import LedgerEvent
    from fedhype.privacy.site_ledger import cap_of, composed, load_site_ledger

    rows, out = {r["name"]: r for r in plan["clients"]}, []
    for folder in folders:
        s = Site.load(folder)
        if s.name not in rows:
            raise ValidationError(f"--site {folder}: site {s.name!r} is not in this plan's cards ({', '.join(rows)})")
        led = load_site_ledger(s.folder, expected=s.ledger, site=s.name)
        r, delta = rows[s.name], (led.delta if led is not None else plan["delta"])
        # the run train makes: the statistics release alone where it runs no DP-SGD round (a probe's site check
        # composed the stage's plan, ε 8.841, where train refused at 8.842 with the release alone's σ₀)
        steps = (plan["default_run"]["release_steps"] if plan.get("default_run") else
                 [*plan["release_steps"], (plan["noise_multiplier"], r["sample_rate"], r["steps"])])
        planned = [LedgerEvent(s.name, -1, "planned", float(sg), float(q), int(n), 1.0) for sg, q, n in steps if n]
        before = composed(led.events, delta) if led is not None else 0.0
        after = composed([*(led.events if led is not None else ()), *planned], delta)
        cap = cap_of(led)
        out.append({"site": s.name, "delta": delta, "spent_epsilon": before, "plan_epsilon": composed(planned, delta),
                    "after_epsilon": after, "max_epsilon": cap, "fits": cap is None or after <= cap * (1 + 1e-9)})
        if cap is not None and not out[-1]["fits"]:
            plan["warnings"].append(f"site {s.name!r}: this plan would take its records to ε = {after:.4f} at δ = "
                                    f"{delta:g} over all its runs, past its cap of {cap:g}: `train --site` and its "
                                    "SuperNode would refuse it")
    plan["sites"] = out
    return plan


def parse_client_sizes(text: str) -> list[tuple[str, str, int]]:
    """``"600,480"`` → ``[("0", "client 0", 600), ("1", "client 1", 480)]``."""
    out = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part.isdigit() or int(part) < 1:
            raise ValidationError(f"--client-sizes: item {i} ({part!r}) is not a positive integer; use e.g. 600,480")
        out.append((str(i), f"client {i}", int(part)))
    return out


def read_partition_sizes(path: Path) -> list[tuple[str, str, int]]:
    """Client ids, names and training-set sizes (public counts) of a ``fedhype partition`` file.

    Raises:
        ArtifactError: missing, corrupt or not a ``fedhype-partition/1`` file.
    """
    from fedhype.data.partition import Partition

    return [(str(s["client"]), str(s["name"]), int(s["train"])) for s in Partition.load(path).sizes()]


def _fmt(v: Any) -> str:
    return "—" if v is None else ("∞" if _infinite(v) else f"{v:.4g}")


def _render_site(result: dict[str, Any], out: Console) -> None:
    cap = result["max_epsilon"]
    table = Table(title=f"site {result['site']}: its records' ledger across runs", caption=result["ledger"])
    for col in ("run", "events", "ε alone"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in result["runs"]:
        table.add_row(r["run"], str(r["events"]), "∞ (seeded)" if r.get("seeded") else
                      "∞ (no DP)" if r["epsilon_infinite"] else _fmt(r["epsilon"]))
    out.print(table)
    if result.get("seeded_runs"):
        out.print(f"seeded run(s): {', '.join(result['seeded_runs'])}: {result['seeded_note']}", style="bold red",
                  highlight=False, soft_wrap=True)
    delta = "—" if result["delta"] is None else f"{result['delta']:g}"
    spent = math.inf if result["epsilon_infinite"] else result["epsilon"]
    out.print(f"spent over all runs: ε = {_fmt(spent)} at δ = {delta} (composed by the accountant, "
              f"not the sum of the runs' ε); cap: {'none (recorded only)' if cap is None else f'{cap:g}'}"
              + ("" if cap is None else f"; left: {_fmt(result['left'])} (a guide: a next run is checked by composing its "
                                   "plan with this ledger)"), highlight=False)


def _render(result: dict[str, Any]) -> None:
    out = Console()
    if result["mode"] in ("site", "sites"):
        for r in result.get("sites", [result]):
            _render_site(r, out)
        return
    if result["mode"] == "single":
        keys = ("epsilon", "accountant", "target_epsilon", "epsilon_prv", "epsilon_rdp", "epsilon_pld", "delta",
                "noise_multiplier", "sample_rate", "steps")
        out.print(kv_table("privacy budget (reported ε: the smaller of PRV and RDP)",
                           {k: "∞" if _infinite(result[k]) else result[k] for k in keys if k in result}))
    else:
        dflt = result.get("default_run")
        if dflt:  # the run train makes by default comes first: the table is the plan with the DP-SGD stage
            out.print(f"[bold]by default `fedhype train` runs no DP-SGD round with these sizes[/]: it releases the "
                      f"class statistics alone at σ₀ = {_fmt(dflt['class_stats_noise_multiplier'])}, ε = "
                      f"{_fmt(dflt['epsilon'])} at δ = {result['delta']:g}; the table is the plan with the DP-SGD "
                      "stage (`fedhype train --dp-sgd-min-records 0`; `fedhype budget --dp-sgd-min-records 0` plans "
                      "it without this note)", highlight=False, soft_wrap=True)
        title = "the DP-SGD stage's plan (--dp-sgd-min-records 0): " if dflt else ""
        table = Table(title=f"{title}privacy budget per client (σ = {result['noise_multiplier']:.4g}, "
                            f"δ = {result['delta']:g})")
        for col in ("client", "n", "q", "steps", "ε PRV", "ε RDP", "ε PLD"):
            table.add_column(col, justify="left" if col == "client" else "right")
        for r in result["clients"]:
            mark = " (worst)" if r["client"] == result["worst_client"] else ""
            table.add_row(f"{r['name']}{mark}", str(r["n"]), _fmt(r["sample_rate"]), str(r["steps"]),
                          _fmt(r["epsilon_prv"]), _fmt(r["epsilon_rdp"]), _fmt(r["epsilon_pld"]))
        out.print(table)
        worst = next((r for r in result["clients"] if r["client"] == result["worst_client"]), None)
        label = result["worst_client"] if worst is None or worst["name"] in (worst["client"], f"client {worst['client']}") else \
            f"{worst['client']} ({worst['name']})"
        out.print(f"worst client: {label}  ε = {_fmt(result['epsilon'])} at δ = {result['delta']:g} "
                  f"({result['accountant'].upper()}, the smaller of PRV and RDP)")
        if result.get("class_stats_noise_multiplier"):
            out.print(f"includes the DP class statistics released once before round 0: σ₀ = "
                      f"{_fmt(result['class_stats_noise_multiplier'])} (alone ε = {_fmt(result['class_stats_epsilon'])}); "
                      "`fedhype train --epsilon` recalibrates both, or pass --noise-multiplier and "
                      "--class-stats-noise-multiplier", highlight=False)
        sa = result.get("secure_aggregation")
        if sa and sa["client_noise_multiplier"]:
            out.print(f"secure aggregation: each of the {sa['clients']} clients adds σ₀/√(m − t) = "
                      f"{_fmt(sa['client_noise_multiplier'])} to its release; the server learns only the sum, which "
                      f"carries σ₀ while at most t = {sa['dropout_tolerance']} clients drop out or collude", highlight=False)
    for r in result.get("sites") or []:
        out.print(f"site {r['site']}: spent ε = {_fmt(r['spent_epsilon'])}, this plan alone {_fmt(r['plan_epsilon'])}, "
                  f"after it {_fmt(r['after_epsilon'])} at δ = {r['delta']:g} (composed over all its runs); cap "
                  + ("none" if r["max_epsilon"] is None else f"{r['max_epsilon']:g}: "
                     + ("fits" if r["fits"] else "[bold red]would be passed[/]")), highlight=False)
    if result.get("note"):
        out.print(result["note"], style="bold red", highlight=False)
    for w in result.get("warnings") or []:
        warn(w)


_TRAIN_DEFAULT_NOTE = "so the plan is the one `fedhype train` runs with the same flags"


def budget(
    noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier", "-s", help="σ: noise std / clip norm. "
                                                     "σ = 0 (no noise) gives ε = ∞: JSON \"epsilon\": null with "
                                                     "\"epsilon_infinite\": true."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Target ε: print the σ that meets it instead."),
    delta: float = typer.Option(..., "--delta", default_factory=config_default("train", "delta"),
                                help="δ, in (0, 1) and well below 1/n of the smallest client (default: train's). "
                                     "Given with one --site: sets that site's δ (its ledger composes every run at it)."),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="Poisson sampling rate q (single mechanism)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Number of steps (single mechanism)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="Federated rounds (plan; default: train's, "
                                         f"{_TRAIN_DEFAULT_NOTE})."),
    local_epochs: Optional[float] = typer.Option(None, "--local-epochs", help="Local epochs per round (plan; may be "
                                                 "fractional, as for `fedhype train`; without it or --local-steps, "
                                                 "train's default)."),
    local_steps: Optional[int] = typer.Option(None, "--local-steps", help="Local steps per round (plan)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Expected batch size B; q_i = B / n_i (plan; "
                                             f"default: train's, {_TRAIN_DEFAULT_NOTE})."),
    client_sizes: Optional[str] = typer.Option(None, "--client-sizes", help="Training-set sizes, e.g. 600,480 (plan)."),
    partition: Optional[Path] = typer.Option(None, "--partition", help="fedhype-partition/1 JSON (plan).",
                                             callback=existing("partition file", "create it with `fedhype partition`")),
    card: Optional[list[Path]] = typer.Option(None, "--card", help="A site's public card (card.json, or its site "
                                              "folder), once per site (plan): the coordinator's sizes n_i.",
                                              callback=existing("site card", "the site writes it with `fedhype site`",
                                                                kind="any", inside="card.json")),
    participation: float = typer.Option(..., "--participation", default_factory=config_default("train", "participation"),
                                        help="Fraction of rounds each client takes part in."),
    class_stats_share: float = typer.Option(..., "--class-stats-share", default_factory=config_default("train", "class_stats_share"),
                                            help="Plan: share of the target ε spent on the DP statistics (class sums, "
                                                 "counts, second moments) that `fedhype train` releases once before round 0 "
                                                 "(default: train's; 0 for methods without them: dp-cvae, no-class-stats)."),
    class_stats_noise_multiplier: Optional[float] = typer.Option(
        None, "--class-stats-noise-multiplier", help="Plan, with --noise-multiplier: σ₀ of the statistics release set "
        "directly (as `fedhype train --class-stats-noise-multiplier`; default: calibrated from --class-stats-share)."),
    centre_share: float = typer.Option(..., "--centre-share", default_factory=config_default("train", "centre_share"),
                                       help="Plan: share of the release's budget spent on its DP centre (as "
                                            "`fedhype train --centre-share`; 0: the uncentred release)."),
    secure_aggregation: bool = typer.Option(..., "--secure-aggregation", default_factory=config_default("train", "secure_aggregation"),
                                            help="Plan: the statistics release under secure aggregation with "
                                                 "distributed noise (as `fedhype train --secure-aggregation`)."),
    dropout_tolerance: int = typer.Option(..., "--dropout-tolerance", default_factory=config_default("train", "dropout_tolerance"),
                                          help="Plan, with --secure-aggregation: t, clients that may drop out or collude."),
    site: Optional[list[Path]] = typer.Option(None, "--site", help="A site folder (from `fedhype site`), once per "
                                              "site: what its records have spent over every run (its ledger across "
                                              "runs, site-ledger.json) and its cap; with --max-epsilon, set the cap.",
                                              callback=existing("site folder", "write it with `fedhype site`",
                                                                kind="any")),
    max_epsilon: Optional[float] = typer.Option(None, "--max-epsilon", help="With one --site: the site's lifetime ε "
                                                "cap over all its runs, at its δ; `train --site` and the site's "
                                                "SuperNode refuse what would pass it."),
    no_cap: bool = typer.Option(False, "--no-cap", help="With one --site: lift the site's cap (its ledger keeps "
                                "recording every run)."),
    dp_sgd_min_records: int = typer.Option(..., "--dp-sgd-min-records", default_factory=config_default("train", "dp_sgd_min_records"),
                                           help="Plan: as `fedhype train --dp-sgd-min-records` (default: train's). "
                                                "Where the median client is below it, train runs no DP-SGD round and "
                                                "the output says first what it runs instead (the statistics release "
                                                "alone, its σ₀ and ε); the table stays the plan with the stage. "
                                                "0: the stage always runs, no such note."),
    json_mode: bool = JsonOpt,
) -> None:
    """ε (the smaller of PRV and RDP; PLD cross-check) for a DP-SGD mechanism or federated plan, or σ for a target ε;
    with --site, what a site's records have spent over all its runs.

    Accountants that disagree beyond their tolerances (e.g. PRV above RDP) are listed as warnings.

    σ = 0 means no noise and ε = ∞ (no DP guarantee): shown as ∞; in JSON "epsilon" is null (strict
    JSON has no infinity) and "epsilon_infinite" is true, with a "note".
    """

    def body() -> dict[str, Any]:
        from fedhype.privacy.accountant import validate_target_epsilon  # torch: imported on use, not for --help

        nonlocal site
        if site is not None:
            given = [name for name, v in (("--noise-multiplier", noise_multiplier), ("--epsilon", epsilon),
                                          ("--sample-rate", sample_rate), ("--steps", steps), ("--rounds", rounds),
                                          ("--local-epochs", local_epochs), ("--local-steps", local_steps),
                                          ("--batch-size", batch_size), ("--client-sizes", client_sizes),
                                          ("--partition", partition), ("--card", card or None),
                                          ("--class-stats-noise-multiplier", class_stats_noise_multiplier))
                     if v is not None]
            plan_given = bool(given) and card is not None and sample_rate is None and steps is None
            if not plan_given and (secure_aggregation or dropout_tolerance):  # were ignored without a word (a probe)
                raise ValidationError("--secure-aggregation/--dropout-tolerance describe a plan's statistics release; "
                                      "--site alone reports the site's ledger: give the plan's cards (--card, once "
                                      "per site) with them, or drop them")
            if given and not plan_given:
                raise ValidationError(f"--site reports a site's ledger across runs (and --max-epsilon sets its cap), or "
                                      f"composes it with a consortium's plan given by --card; {', '.join(given)} "
                                      f"{'describe' if len(given) > 1 else 'describes'} no such plan: give the cards "
                                      "(--card, once per site) or run the plan without --site")
            if plan_given and (max_epsilon is not None or no_cap):
                raise ValidationError("--max-epsilon and --no-cap change a site's cap: give them without a plan")
            if max_epsilon is not None and no_cap:
                raise ValidationError("give --max-epsilon (set the site's cap) or --no-cap (lift it), not both")
            import click

            explicit = click.get_current_context().get_parameter_source("delta") in (
                click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
            if plan_given:
                sites_ = list(site)
                site = None  # the plan below, then each site's ledger composed with its share of it
                return _with_sites(body(), sites_)
            if len(site) > 1:
                if max_epsilon is not None or no_cap or explicit:
                    raise ValidationError("--max-epsilon, --no-cap and --delta change one site's ledger: give one --site")
                if len({p.resolve() for p in site}) < len(site):
                    raise ValidationError("--site: the same site folder is given more than once")
                return {"mode": "sites", "sites": [budget_site(p) for p in site]}
            return budget_site(site[0], max_epsilon, delta if explicit else None, no_cap)
        if max_epsilon is not None or no_cap:
            raise ValidationError(f"{'--max-epsilon' if max_epsilon is not None else '--no-cap'} changes a site's "
                                  "lifetime cap: give it with --site DIR (a run's own limit is "
                                  "`fedhype train --max-epsilon`)")
        if (noise_multiplier is None) == (epsilon is None):
            raise ValidationError("give exactly one of --noise-multiplier or --epsilon (a target)")
        if epsilon is not None:
            validate_target_epsilon(epsilon, "--epsilon")
        if class_stats_noise_multiplier is not None and noise_multiplier is None:
            raise ValidationError("--class-stats-noise-multiplier sets σ₀ beside a given --noise-multiplier (as in "
                                  "`fedhype train`); with --epsilon both are calibrated: drop it, or give σ")
        if class_stats_noise_multiplier is not None and not (math.isfinite(class_stats_noise_multiplier)
                                                             and class_stats_noise_multiplier > 0):
            raise ValidationError(f"--class-stats-noise-multiplier must be a finite number > 0 (as train's), got "
                                  f"{class_stats_noise_multiplier:g}")
        plan_flags = (rounds, local_epochs, local_steps, batch_size, client_sizes, partition, card or None)
        if all(v is None for v in plan_flags):
            if sample_rate is None or steps is None:
                # both ways at once (a probe's `budget --epsilon 1` was sent to --rounds, then asked for sizes)
                raise ValidationError("say what is accounted: a single mechanism's --sample-rate and --steps, or a "
                                      "federated plan's training-set sizes (--client-sizes 600,480, --partition "
                                      "FILE or --card per site; rounds and batch size default to train's)")
            if class_stats_noise_multiplier is not None:
                raise ValidationError("--class-stats-noise-multiplier is a federated plan's statistics release; a "
                                      "single mechanism has none (give a plan: --client-sizes, --partition or --card)")
            if secure_aggregation or dropout_tolerance:
                raise ValidationError("--secure-aggregation/--dropout-tolerance describe a federated plan's statistics "
                                      "release; a single mechanism has none (give a plan: --rounds …)")
            return budget_single(delta, sample_rate, steps, noise_multiplier, epsilon)
        if sample_rate is not None or steps is not None:
            raise ValidationError("--sample-rate/--steps describe a single mechanism; a plan derives them (drop them)")
        n_rounds = rounds if rounds is not None else config_default("train", "rounds")()  # as `fedhype train`
        batch = batch_size if batch_size is not None else config_default("train", "batch_size")()
        if sum(v is not None for v in (client_sizes, partition, card or None)) != 1:
            raise ValidationError("give exactly one of --client-sizes, --partition or --card (once per site)")
        if card:
            from fedhype.data.roster import Roster
            from fedhype.data.sites import SiteCard

            # as `fedhype train --site`: one site per name and key, one encoder and dimension for all
            roster = Roster.from_cards([SiteCard.load(p) for p in card])
            clients = [(str(c.id), c.name, c.n_train) for c in roster.clients]
        else:
            clients = parse_client_sizes(client_sizes) if client_sizes is not None else read_partition_sizes(partition)
        epochs = local_epochs  # neither given: as `fedhype train`, its default local epochs
        if local_epochs is None and local_steps is None:
            epochs = config_default("train", "local_epochs")()
        return budget_plan(delta, n_rounds, batch, clients, epochs, local_steps, participation,
                           noise_multiplier, epsilon, class_stats_share=class_stats_share,
                           class_stats_noise_multiplier=class_stats_noise_multiplier, secure_aggregation=secure_aggregation, dropout_tolerance=dropout_tolerance,
                           centre_share=centre_share, dp_sgd_min_records=dp_sgd_min_records)

    run_command(body, json_mode, render=_render)


def register(app: typer.Typer) -> None:
    """Add ``fedhype budget`` to ``app``."""
    app.command("budget", cls=JobDefaultsCommand)(budget)
