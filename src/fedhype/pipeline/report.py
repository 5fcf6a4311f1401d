"""``report.json`` and ``report.md`` of a job, with plots."""

from __future__ import annotations

import hashlib
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fedhype import __version__
from fedhype.federated.result import NO_ROUND_TRAFFIC  # noqa: F401  (report.json's note of a run without a round)
from fedhype.io import atomic_write_json, atomic_write_text, read_json
from fedhype.privacy.plan import above_target, epsilon_text  # noqa: F401  (above_target re-exported: the CLI and the tests read it here)


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def client_epsilons(run_dir: Path, epsilon_per_client: dict[str, float] | None) -> list[dict[str, Any]]:
    """``[{"id", "name", "epsilon"}, ...]``: each trained client's ε, with its ledger id and its name.

    Args:
        run_dir: the run directory; ids and names come from its ``model.safetensors`` metadata
            (the clients training ran over, in ledger-id order).
        epsilon_per_client: ledger client id (``"0"``, ``"1"``, …) → ε, as the engine returns it
            (None or empty for a ``--no-dp`` run: every ``epsilon`` is then None).
    """
    from fedhype.federated.rundir import load_model

    _, _, meta = load_model(run_dir)
    ids = [str(i) for i in meta["clients"]]
    names = [str(n) for n in (meta.get("client_names") or ids)]
    eps = epsilon_per_client or {}
    return [{"id": i, "name": n, "epsilon": eps.get(i)} for i, n in zip(ids, names)]


def by_name(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Client name → ε of :func:`client_epsilons` rows (``"name [id]"`` where names repeat)."""
    names = [r["name"] for r in rows]
    return {(r["name"] if names.count(r["name"]) == 1 else f"{r['name']} [{r['id']}]"): r["epsilon"] for r in rows}


def write_report(out: Path, conf: dict, store, part, trained: dict, syn, ev: dict, timings: dict) -> dict[str, Any]:
    """Write report.json / report.md / plots; return the report dict."""
    from torch.nn import functional as F

    from fedhype.encoders.checks import store_warnings
    from fedhype.pipeline.plots import projection_plot, training_plot

    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    test = part.split_store(store, "test")
    projection_plot(F.normalize(test.embeddings, dim=-1).numpy(), test.labels.numpy(), syn.embeddings.numpy(),
                    syn.labels.numpy(), store.class_names, plots / "projection.png")
    metrics = read_json(out / "run" / "metrics.json", "metrics")
    claims = _class_stats_claims(out / "run", trained)
    release = claims.get("class_stats_epsilon")
    target = conf["train"].get("epsilon") if trained["private"] and conf["train"].get("noise_multiplier") is None else None
    curves = bool(trained.get("rounds"))  # a run with no DP-SGD round (dp-gaussian, no-dp-sgd) has no curve to draw
    if curves:
        training_plot(metrics, plots / "training.png", release_epsilon=release, target_epsilon=target)
    if ev.get("code_domain"):
        from fedhype.pipeline.plots import code_domain_plot

        code_domain_plot(ev["code_domain"], plots / "code_domain.png")
    per_client = client_epsilons(out / "run", trained.get("epsilon_per_client"))
    report = {
        "epsilon": trained["epsilon"], "delta": trained["delta"], "private": trained["private"],
        "target_epsilon": target, "above_target": above_target(trained["epsilon"], target),
        "recharged": _recharged_of(out / "run") if trained["private"] else None,
        "accountant": "best", "noise_multiplier": trained["noise_multiplier"],
        # the DP-SGD C: None where no round ran (it clipped nothing; the training result says so itself)
        "clip_norm": trained.get("clip_norm"),
        "method": _run_method(out / "run", conf), "n_classes": store.n_classes,
        # the accuracy of always guessing the test split's most frequent class: the report's chance level
        "majority_share": (float(torch.bincount(test.labels).max()) / len(test)) if len(test) else None,
        "dp_sgd_stage_off": _stage_off(out / "run", conf, part),
        "class_stats_noise_multiplier": trained.get("class_stats_noise_multiplier"),
        "second_moment_share": _second_moment_share(conf),
        "centre_share": float(conf["train"].get("centre_share") or 0.0) if trained["private"] else None,
        "release_centre": _release_centre(conf) if trained["private"] else None,
        "secure_aggregation": _secure_aggregation(conf, part, trained),
        **claims,
        "rounds": trained["rounds"], "clients": [c.name for c in part.clients],
        "client_sizes": [len(c.train) for c in part.clients],
        # ε per client keyed by client name (as in "clients"); "client_epsilons" keeps the ledger ids
        "epsilon_per_client": by_name(per_client), "client_epsilons": per_client,
        "noise_seeded": trained["noise_seeded"],
        "mmd2": ev["mmd2"], "mmd2_p_value": ev["mmd2_p_value"], "fd": ev["fd"],
        "precision": ev["precision"], "recall": ev["recall"], "density": ev["density"], "coverage": ev["coverage"],
        "tstr_accuracy": ev["tstr_accuracy"], "tstr_balanced_accuracy": ev.get("tstr_balanced_accuracy"),
        "tstr_macro_f1": ev.get("tstr_macro_f1"), "trtr_accuracy": ev["trtr_accuracy"],
        "interpolation_mean_accuracy": ev.get("interpolation", {}).get("mean_accuracy"),
        "interpolation_mean_lambda": ev.get("interpolation", {}).get("mean_lambda"),
        "prototypes": ev.get("prototypes"),
        "downstream": downstream_summary(ev.get("downstream")),
        "code_domain": ev.get("code_domain"),
        **_dp_linear_keys(ev.get("dp_linear")),
        "dp_linear_kept_epsilon": None if ev.get("dp_linear") else _kept_dp_linear_epsilon(out / "dp_linear"),
        # unreadable files skipped, classes without a record, tiny images: the embed stage warned on stderr only
        # (a probe's report said nothing of 3 skipped files); data.strict stops on the first unreadable one instead
        "data_warnings": store_warnings(store, where="the job's store", limit=conf["data"].get("limit") or None,
                                        limit_name="data.limit", images=bool(conf["data"].get("images")), skipped=True),
        "n_real": len(store), "n_test": ev.get("n_real"), "dim": store.dim, "encoder": store.meta.get("encoder"),
        "n_synthetic": len(syn), "code": syn.meta.get("code"), "codes_note": syn.meta.get("codes_note"),
        "anchor": syn.meta.get("anchor", "off"),
        "release_choices": _release_choices(out / "run"),
        "model": _model_sizes(out / "run"),
        "timings_s": dict(timings), "timings_earlier_s": list(getattr(timings, "earlier", [])),
        # each earlier run's record: its start, its stages and, for a run that stopped, the stage it stopped in
        "timings_earlier_runs": list(getattr(timings, "earlier_runs", [])),
        # the model's sizes and the bytes a client downloads / uploads per DP-SGD round: 0, with a note, where no
        # round ran (the statistics release before round 0 is not counted in them): as the training result has them
        # (fedhype.federated.result.without_rounds)
        "traffic": trained.get("traffic"),
        "held_out_not_dp": held_out_trend(metrics),
        "report": str(out / "report.md"), "plots": [str(plots / "projection.png")] + ([str(plots / "training.png")] if curves else []),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads", "date": time.strftime("%Y-%m-%d"),
        "fedhype_version": __version__,
    }
    text = _markdown(report, ev, conf)
    # the audit ties the text to the figures: a probe's report.md edited to "ε = 0.1" passed
    report["report_md_sha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    atomic_write_json(out / "report.json", strict_json(report))
    atomic_write_text(out / "report.md", text)
    return report


def _run_method(run: Path, conf: dict) -> str | None:
    """The method the run trained (its ``config.json``: ``no-dp-sgd`` where the DP-SGD stage rule switched
    ``fedhypevae``'s stage off), else the job's."""
    try:
        return str(read_json(run / "config.json", "run config")["train"]["method"])
    except Exception:  # noqa: BLE001 - the job's setting is the fallback
        return conf["train"].get("method")


def _stage_off(run: Path, conf: dict, part) -> str | None:
    """Why the run has no DP-SGD stage although the job asked ``fedhypevae`` (decision 22), else None."""
    from fedhype.pipeline.config import train_config

    if _run_method(run, conf) == conf["train"].get("method"):
        return None
    return train_config(conf).stage_off_reason([len(c.train) for c in part.clients])


def _release_choices(run: Path) -> dict[str, Any] | None:
    """The statistics release's post-processing choices the run recorded (``release.json``: the located share
    ``model.located_share`` used, the class means' James–Stein factor F and the located directions r;
    :func:`fedhype.federated.class_stats.release_notes`), or None (no release, or a run before they were recorded)."""
    path = run / "release.json"
    if not path.exists():
        return None
    notes = read_json(path, "release outputs")
    from fedhype.federated.class_stats import RELEASE_NOTE_KEYS

    kept = {k: notes[k] for k in RELEASE_NOTE_KEYS if k in notes}
    return kept or None


def _model_sizes(run: Path) -> dict[str, Any] | None:
    """The model's resolved sizes (the run's ``config.json``: ``latent``, ``hidden``, ``code_dim``, ``decoder``) with
    what the job asked of the two set by a rule (``latent_asked``, ``code_dim_asked``: ``"auto"`` where not given),
    or None (no run config)."""
    path = run / "config.json"
    if not path.exists():
        return None
    conf = read_json(path, "run config")
    model, asked = conf.get("model") or {}, ((conf.get("train") or {}).get("model") or {})
    out = {k: model[k] for k in ("latent", "hidden", "code_dim", "decoder") if k in model}
    for k in ("latent", "code_dim"):
        if k in out:
            out[f"{k}_asked"] = asked.get(k, "auto")
    return out or None


def _model_line(m: dict[str, Any] | None, traffic: dict[str, Any] | None) -> list[str]:
    """The report's Model line: the resolved sizes (a size set by ``"auto"`` says so) and the parameters, or []."""
    if not m:
        return []
    def size(k: str, name: str) -> str:
        rule = " (`auto`)" if m.get(f"{k}_asked") == "auto" else ""
        return f"{name} {m[k]}{rule}"
    parts = [size(k, n) for k, n in (("latent", "latent size"), ("code_dim", "code dimension")) if k in m]
    parts += [f"hidden width {m['hidden']}"] if "hidden" in m else []
    parts += [f"decoder `{m['decoder']}`"] if "decoder" in m else []
    t = traffic or {}
    params = (f"; {t['hypernetwork_parameters'] / 1e6:.1f} M hypernetwork parameters"
              if t.get("hypernetwork_parameters") else "")
    return [f"Model: {', '.join(parts)}{params}.", ""]


def _share_clause(c: dict[str, Any] | None) -> str:
    """``; located share s = 0.8 (…)`` for the report's Synthetic line, or "" (docs/method.md, decision 16)."""
    if not c or "located_share" not in c or isinstance(c["located_share"], list):
        return ""
    f, r = c.get("class_mean_snr"), c.get("located_directions")
    why = f" (class-mean James–Stein factor F = {f:.3f}, {r} located directions)" if f is not None and r is not None else ""
    return f"; located share s = {c['located_share']:g} of the unlocated variance on the located directions{why}"


def _trend_sentence(t: dict | None) -> str:
    if not t:
        return ""
    (r0, r1), (e0, e1), (m0, m1) = t["rounds"], t["val_neg_elbo"], t["val_mmd2"]
    s = f" From round {r0} to round {r1} the held-out −ELBO went {e0:.6g} → {e1:.6g} and MMD² {m0:.4g} → {m1:.4g}"
    if t["worse"]:
        s += (": **the DP-SGD rounds made the held-out fit worse, not better** (on small training sets they add nothing "
              "measurable: README, \"Where the result stands\", and docs/method.md decision 22, which runs them only where "
              "the median client has train.dp_sgd_min_records); `--method dp-gaussian` samples the statistics release alone — the "
              "model before the rounds — with the whole ε")
    return s + "."


def held_out_trend(metrics: list) -> dict[str, Any] | None:
    """The held-out diagnostics (``diagnostics_not_dp`` of ``metrics.json``) of the first and the last round.

    Returns ``{"rounds": [first, last], "val_neg_elbo": [first, last], "val_mmd2": [first, last], "worse": bool}``
    (``worse``: both rose), or None with fewer than two rounds that carry them. A new user's probe saw held-out
    −ELBO and MMD² rise in every round of a small consortium (54–72 records a site) with no word in the report.
    Computed on validation records: not covered by DP, for the data holder's eyes (as the curves)."""
    rows = [m for m in metrics if isinstance(m, dict) and isinstance(m.get("diagnostics_not_dp"), dict)
            and all(k in m["diagnostics_not_dp"] for k in ("val_neg_elbo", "val_mmd2"))]
    if len(rows) < 2:
        return None
    a, b = rows[0], rows[-1]
    out = {"rounds": [int(a["round"]) + 1, int(b["round"]) + 1]}
    for k in ("val_neg_elbo", "val_mmd2"):
        out[k] = [float(a["diagnostics_not_dp"][k]), float(b["diagnostics_not_dp"][k])]
    out["worse"] = out["val_neg_elbo"][1] > out["val_neg_elbo"][0] and out["val_mmd2"][1] > out["val_mmd2"][0]
    return out


def _kept_dp_linear_epsilon(folder: Path) -> float | None:
    """The ε of a DP linear reference an earlier run of the job left in ``folder`` (``dp_linear/``) although this run
    does not present it (a rerun with ``evaluate.dp_linear = false``), or None: the report still names that second DP
    model of the same records (a new user's report dropped it while the audit warned of it)."""
    from fedhype.eval.audit_dp_linear import _privacy_record
    from fedhype.errors import ArtifactError

    try:
        privacy = _privacy_record(folder)
    except ArtifactError:
        return None
    if not privacy or not privacy.get("private") or privacy.get("epsilon") is None:
        return None
    return float(privacy["epsilon"])


def _dp_linear_keys(d: dict | None) -> dict[str, Any]:
    """``dp_fedavg_linear_*`` report keys (None when ``[evaluate] dp_linear`` is off): a separate release."""
    keys = ("accuracy", "balanced_accuracy", "macro_f1", "epsilon", "delta", "private", "noise_multiplier")
    out = {f"dp_fedavg_linear_{k}": (d or {}).get(k) for k in keys}
    out["dp_fedavg_linear_per_client_accuracy"] = (
        {name: row["accuracy"] for name, row in d["per_client"].items()} if d else None)
    return out


#: the per-client table's rows and their names in the report
DOWNSTREAM_ROWS = {"local_only": "local-only", "synthetic_only": "synthetic-only", "local_synthetic": "local + synthetic",
                   "interpolation": "λ-interpolation"}


def downstream_summary(d: dict | None) -> dict | None:
    """The report's view of :func:`fedhype.eval.client_downstream.client_downstream` (None when it did not run):
    the means over clients, the gains of local + synthetic over local-only, and per client its accuracies
    (own test split and union of the test splits), the chosen real share r and λ, and the classes it lacks."""
    if not d:
        return None
    per = {name: {"n_train": c["n_train"], "missing_classes": c["missing_classes"], "real_share": c["real_share"],
                  "lambda": c["lambda"], **{w: {row: c[w][row]["accuracy"] for row in DOWNSTREAM_ROWS}
                                            for w in ("own", "union")}}
           for name, c in d["clients"].items()}
    union_gains = [c["union"]["local_synthetic"] - c["union"]["local_only"] for c in per.values()]
    return {"mean": d["mean"], "gain_own_accuracy": d["gain_own_accuracy"], "gain_union_accuracy": d["gain_union_accuracy"],
            "clients_gaining_union": sum(g > 0 for g in union_gains), "per_client": per,
            "n_union_test": d["n_union_test"], "select_by": d["select_by"], "private": False,
            "gain_union_resolution": gain_resolution(union_gains, d["n_union_test"])}


def gain_resolution(gains: list[float], n_test: int) -> float:
    """The smallest mean gain the per-client table can tell from nothing: two standard errors of the clients' mean
    gain (their spread over √m, m ≥ 2 clients), and never below two records of the ``n_test``-record union test set.

    A probe's report said "the synthetic data helps the clients" on a mean gain of +0.003 (a third of one of 108
    test records) where two of three clients lost; the verdict now needs the mean beyond this figure and most
    clients on its side.
    """
    floor = 2.0 / max(int(n_test), 1)
    if len(gains) < 2:
        return floor
    return max(floor, 2.0 * statistics.stdev(gains) / math.sqrt(len(gains)))


def _downstream_lines(dd: dict) -> list[str]:
    """The report.md section of :func:`downstream_summary`."""
    rows = list(DOWNSTREAM_ROWS)
    lines = ["", "## Downstream value per client (linear probes; accuracy on the client's own test split / on the "
                 "union of all clients' test splits)", "",
             "Each client trains on its own real training records only (local-only), on the shared synthetic store only, "
             "on both (local + synthetic: within each class it holds, its real records get the share r of the class's "
             "weight, r chosen on its validation split; the classes it lacks come from the synthetic records alone), and "
             "the predecessor's λ-interpolation of the first two (λ chosen on validation). These figures use held-out "
             f"real records and are not covered by DP; the union test set has {dd['n_union_test']} records.", "",
             "| client | train records | classes it lacks | " + " | ".join(DOWNSTREAM_ROWS.values()) + " | r | λ |",
             "|---|---|---|" + "---|" * len(rows) + "---|---|"]
    for name, c in dd["per_client"].items():
        cells = [f"{c['own'][row]:.3f} / {c['union'][row]:.3f}" for row in rows]
        r = "unweighted" if c["real_share"] is None else f"{c['real_share']:g}"
        lines.append(f"| {name} | {c['n_train']} | {', '.join(c['missing_classes']) or '–'} | " + " | ".join(cells)
                     + f" | {r} | {c['lambda']:g} |")
    m = dd["mean"]
    lines.append("| **mean** | | | " + " | ".join(f"{m['own'][row]['accuracy']:.3f} / {m['union'][row]['accuracy']:.3f}"
                                                  for row in rows) + " | | |")
    n = len(dd["per_client"])
    g = dd["gain_union_accuracy"]
    lines += ["", f"Local + synthetic against local-only: {g:+.3f} accuracy on the union test set for the average "
                  f"client ({dd['clients_gaining_union']} of {n} clients gain), {dd['gain_own_accuracy']:+.3f} on their "
                  "own test splits. "
                  + _downstream_verdict(g, dd["clients_gaining_union"], n, dd.get("gain_union_resolution")),
              "", "The classifiers trained with hyper-prototype anchors from the synthetic store (FedHPro) and FedProto "
                  "class means are compared per client by `benchmarks/downstream.py` "
                  "(`fedhype.prototypes.anchored`), not in this job: they train a network per client."]
    return lines


def _code_domain_sentence(cd: dict) -> str:
    """Which client codes capture their clients: closest to their own domain, and the closest code to it."""
    if cd.get("codes_indistinguishable"):
        return (f"The client codes are indistinguishable here: their MMD² to each domain differ by at most "
                f"{cd['codes_spread']:.4f}, so no code captures its own client (too little signal at this ε and size).")
    own_code = cd.get("own_code_is_closest") or {}
    return ("A code that captures its client is closest (lowest MMD²) to its own domain, and closer to it than any "
            "other client's code: " + ", ".join(f"{k} {'yes' if v and own_code.get(k, True) else 'no'}"
                                               for k, v in cd["own_domain_is_closest"].items()) + ".")


def _recharged_of(run_dir: Path) -> str | None:
    """:func:`fedhype.privacy.ledger.recharged_text` of the run's ledger (None when nothing was charged again)."""
    from fedhype.privacy.ledger import PrivacyLedger, recharged_text

    path = Path(run_dir) / "ledger.json"
    return recharged_text(PrivacyLedger.load(path)) if path.is_file() else None


def _recharged_words(r: dict) -> str:
    """Why a run's ε is above its target: what it charged again on resume (``r["recharged"]``, from the ledger)."""
    what = r.get("recharged")
    if not what:  # nothing charged twice: the plan itself spent more (a probe's report gave an interruption as reason)
        return "the plan's noise spends more than the target (nothing was charged again), see the ledger"
    from fedhype.privacy.ledger import charged_again_clause

    return f"{charged_again_clause(what)}, see the ledger"


def _downstream_verdict(g: float, gaining: int, n: int, resolution: float | None) -> str:
    """The per-client table's conclusion: a gain or loss only beyond :func:`gain_resolution` and on most clients."""
    if resolution is None:  # a report written before the resolution was recorded
        resolution = 0.0
    if g > resolution and gaining > n / 2:
        return "The synthetic data helps the clients beyond what they hold."
    if g < -resolution and gaining < n / 2:
        return "The synthetic data lowers the average client's accuracy on the union test set here."
    return (f"No measurable effect on the average client: the mean gain is within ±{resolution:.3f} (two standard "
            "errors of the clients' gains, at least two test records) or most clients do not share its sign.")


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (strict JSON has no Infinity/NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def _second_moment_share(conf: dict) -> float | None:
    """c² of the release when the run's model releases second moments, else None."""
    from fedhype.pipeline.config import train_config

    cfg = train_config(conf)
    return float(cfg.second_moment_share) if cfg.model_config(1, 2).linear_path and not cfg.no_dp else None


def _secure_aggregation(conf: dict, part, trained: dict) -> dict | None:
    """The secure-aggregation settings and trust assumption of a private run that used it, else None."""
    t = conf["train"]
    if not t.get("secure_aggregation") or not trained.get("private") or not trained.get("class_stats_noise_multiplier"):
        return None
    m, tol = len(part.clients), int(t.get("dropout_tolerance") or 0)
    s0 = float(trained["class_stats_noise_multiplier"])
    return {"clients": m, "dropout_tolerance": tol, "client_noise_multiplier": s0 / math.sqrt(m - tol),
            "trust": (f"the statistics released before round 0 were summed by secure aggregation: each client added "
                      f"σ₀/√(m − t) = {s0 / math.sqrt(m - tol):.4g} (m = {m}, t = {tol}) and the server learned only the "
                      f"sum, which carries σ₀ = {s0:.4g}. The claimed ε holds if the aggregation protocol hides the "
                      f"individual shares and at most {tol} client(s) drop out or collude with the server together. If "
                      f"more than {tol} drop out, the aggregator refuses to release the sum; collusion cannot be "
                      "detected, and with more colluders the guarantee is weaker than claimed. The DP-SGD updates of "
                      "the rounds are per client, with the full noise, and the client codes carry no per-client "
                      "statistics (the server never saw them)")}


def _class_stats_claims(run_dir: Path, trained: dict) -> dict:
    """ε of the class-statistics release alone and how many times each client was charged for it
    (:func:`fedhype.privacy.events.release_claims`; ``fedhype audit`` recomputes them the same way)."""
    s0 = trained.get("class_stats_noise_multiplier")
    if not s0 or not trained.get("private"):
        return {"class_stats_epsilon": None, "class_stats_releases": None}
    from fedhype.privacy.events import release_claims
    from fedhype.privacy.ledger import PrivacyLedger

    return release_claims(PrivacyLedger.load(Path(run_dir) / "ledger.json").events, trained["delta"], s0)


def _no_round_clause(r: dict) -> str:
    """`` — the statistics release alone, no DP-SGD round (why)`` for the At-a-glance privacy line of a run that
    trained no round (``rounds`` 0), else "": the stage rule's reason up to its first colon (``dp_sgd_stage_off``:
    the median client's size and the threshold), or the method that trains none."""
    if r.get("rounds") != 0:
        return ""
    off = r.get("dp_sgd_stage_off")
    why = off.split(":", 1)[0] if off else (f"`--method {r['method']}`" if r.get("method") else "")
    return " — the statistics release alone, no DP-SGD round" + (f" ({why})" if why else "")


def glance(r: dict) -> list[str]:
    """The report's first section: is the synthetic data useful, and what did it cost (plain sentences)."""
    k = r.get("n_classes") or 0
    # the best constant guess: the test split's most frequent class (1/K only where the classes are balanced; a
    # probe's test split with a one-record class had 1/5 = 0.200 against a best guess of 0.25, which overstated the
    # share of the real data's gain the synthetic data carries)
    chance = r.get("majority_share") or (1.0 / k if k else None)
    out = []
    if r["private"]:
        tgt = r.get("target_epsilon")
        over = tgt is not None and above_target(r["epsilon"], tgt)
        # 4 significant digits: 3 printed an ε of 4.0034 as "4", under a target of 4
        out.append(f"- **Privacy.** Every training record is protected by (ε = {epsilon_text(r['epsilon'], tgt)}, δ = {r['delta']:g})-"
                   "differential privacy (the worst client's ε, recomputed from the ledger"
                   + (f"; **above the target {tgt:g}**: {_recharged_words(r)}" if over
                      else f"; the target was {tgt:g}" if tgt is not None else "") + ") for what `release/` holds"
                   + _no_round_clause(r) + ". Smaller ε is stronger; ε ≤ 1 is strong, ε ≈ 8 is weak but still bounded."
                   + (f" The job also trained the DP linear reference below on the same records, a separate release "
                      f"with its own ε = {r['dp_fedavg_linear_epsilon']:.3g}: a record in both has spent both "
                      "(sequential composition); it stays with the data holder unless shared too."
                      if r.get("dp_fedavg_linear_private") and r.get("dp_fedavg_linear_epsilon") is not None else
                      f" `dp_linear/` still holds the DP linear reference an earlier run of this job trained on the "
                      f"same records (its own ε = {r['dp_linear_kept_epsilon']:.3g}; this run, with "
                      "`evaluate.dp_linear = false`, does not present it): a record in both has spent both (sequential "
                      "composition); it stays with the data holder unless shared too — delete the folder if it is not "
                      "needed." if r.get("dp_linear_kept_epsilon") is not None else "")
                   + (" **But the noise was seeded** (`train.seed`): whoever knows the seed can regenerate and remove "
                      "it, so this holds only while the seed stays secret; do not share this run as private, train "
                      "again without a seed." if r.get("noise_seeded") else ""))
    else:
        out.append("- **Privacy: none.** This run was trained with `no_dp`: the synthetic data may reveal training "
                   "records and must not be shared as private.")
    tstr, trtr = r.get("tstr_accuracy"), r.get("trtr_accuracy")
    if tstr is not None and chance is not None:
        line = (f"- **Usefulness.** A classifier trained only on the synthetic embeddings scores {tstr:.3f} on held-out "
                f"real data (TSTR); a constant guess (the most frequent class) scores {chance:.3f}")
        if trtr is not None and trtr > chance:
            share = max(0.0, (tstr - chance) / (trtr - chance))
            line += (f" and the same classifier trained on the real records {trtr:.3f}: the synthetic data carries "
                     f"{100 * share:.0f}% of the real data's gain over chance")
        out.append(line + ".")
    dd = r.get("downstream")
    if dd:
        n = len(dd["per_client"])
        out.append(f"- **For each client.** A client that trains on its own records together with the synthetic data, "
                   f"instead of its own records alone, changes its accuracy on all clients' held-out data by "
                   f"{dd['gain_union_accuracy']:+.3f} on average ({dd['clients_gaining_union']} of {n} clients gain) and "
                   f"on its own held-out data by {dd['gain_own_accuracy']:+.3f} (table below).")
    lin = r.get("dp_fedavg_linear_accuracy")
    if lin is not None and tstr is not None and r.get("dp_fedavg_linear_private"):
        better = "the synthetic data does better" if tstr > lin else "the directly trained classifier does better"
        n_test = r.get("n_test")
        if n_test:  # binomial standard error of the difference (the two accuracies as independent): a small test
            # split cannot tell them apart (a new user's 32 test records gave "better" for 4 records)
            se = math.sqrt(tstr * (1 - tstr) / n_test + lin * (1 - lin) / n_test)
            if abs(tstr - lin) < 2 * se:
                better = (f"the two are within noise on these {n_test} test records (difference {tstr - lin:+.3f}, "
                          f"{abs(tstr - lin) / se:.1f} standard errors): neither is clearly better")
        out.append(f"- **Against the direct alternative.** A linear classifier trained under DP on the real records "
                   f"themselves (DP-SGD FedAvg, its own ε = {r['dp_fedavg_linear_epsilon']:.3g}) scores {lin:.3f}: for "
                   f"this one task {better}; the synthetic data can also serve other models and questions.")
    if r.get("mmd2") is not None:
        p = r.get("mmd2_p_value")
        test = ("" if p is None else
                f"; a two-sample test {'tells the synthetic set from the real one' if p < 0.05 else 'cannot tell the two sets apart'}"
                f" (p = {p:.3g})")
        cov = r.get("coverage")
        out.append(f"- **Fidelity.** MMD² = {r['mmd2']:.3g} to the real test embeddings (0 = same distribution){test}. "
                   + (f"Precision {r['precision']:.2f} / coverage {cov:.2f}: the share of synthetic points inside the real "
                      "records' k-nearest-neighbour balls, and of real records with a synthetic point nearby "
                      + ("(0: no synthetic point falls where real records lie, the samples sit off the real records' "
                         "manifold; in benchmarks/results/utility.md ours reaches precision / coverage ≥ 0.3 only at ε = 8 and without "
                         "DP on the digits domains, where the release's class means are precise, README 'Where we are "
                         "not ahead')" if cov == 0
                         else "(1 = perfect)") + "."
                      if cov is not None else ""))
    return out


def _release_centre(conf: dict) -> str:
    """``client`` or ``pooled``: the centre the job's release clipped around (``train.release_centre``, auto resolved)."""
    from fedhype.federated.config import TrainConfig

    t = conf["train"]
    return TrainConfig(release_centre=t.get("release_centre", "auto"),
                       secure_aggregation=bool(t.get("secure_aggregation"))).centre_mode()


def _stopped(run: dict) -> str:
    """`` (interrupted in train: Ctrl-C or SIGTERM)`` for an earlier run that stopped (:class:`StageTimings`)."""
    if not run.get("stopped_by"):
        return ""
    stage = run.get("interrupted")
    if str(run["stopped_by"]).startswith("refused"):  # e.g. a rerun with other settings: a refusal, not a stop
        return f" (refused{' in ' + stage[:-2] if stage else ''}: {run['stopped_by'][len('refused ('):-1]})"
    return f" (interrupted{' in ' + stage[:-2] if stage else ''}: {run['stopped_by']})"


def share_line(private: bool, seeded: bool = False) -> str:
    """The report's "What to share" item: the release folder for a private run; nothing, as private, without DP or
    with seeded noise (``train.seed``: whoever holds the seed can remove the noise)."""
    stays = ("This report, the plots, `evaluation.json`, the real embeddings, the partition and `run/` stay with the "
             "data holder: their figures are computed on real records outside the DP path.")
    if private and seeded:
        return ("- **What to share: nothing, as private data, while the noise is seeded.** `release/` holds the DP "
                "model, its ledger, the synthetic embeddings and `privacy.json`, but the noise was drawn from "
                "`train.seed`, which its config carries: whoever holds the seed can regenerate and remove it (train "
                "again without a seed for a release). " + stays)
    if private:
        return ("- **What to share.** `release/` (the DP model, its ledger, the synthetic embeddings and `privacy.json`; "
                "a recipient checks ε with `fedhype audit --run release/`). " + stays)
    return ("- **What to share: nothing, as private data.** This run was trained without DP (`no_dp`): `release/` "
            "holds the generator, the synthetic embeddings and `privacy.json` (private = false), and none of it is "
            "private: it must not leave the site as private data (train again with a target ε for a folder that "
            "may). " + stays)


def _markdown(r: dict, ev: dict, conf: dict) -> str:
    target = conf["train"].get("epsilon")
    over = (f" — **above the target ε = {target}**: {_recharged_words(r)}"
            if r["private"] and above_target(r["epsilon"], target) else "")
    sgd = (f"DP-SGD σ = {_fmt(r['noise_multiplier'])}, C = {r['clip_norm']}" if r.get("noise_multiplier") is not None
           else f"no DP-SGD round: the model is the release itself ({r.get('method')})")
    priv = (f"**ε = {_fmt(r['epsilon'])}** at δ = {r['delta']} (accountant: the smaller of Opacus's PRV and RDP upper "
            f"bounds, worst client, for the steps run; target {target}; {sgd}"
            + (f"; statistics released once before round 0 — "
               + (("a DP centre per client (its own, pulled toward the pooled one where its offset is mostly noise)"
                   if r.get("release_centre") == "client" else "a DP centre") + ", then the class sums, counts"
                  if r.get("centre_share") else "class sums, counts")
               + (" and second moments" if r.get("second_moment_share") else "")
               + (" of the records' deviations from it, clipped (two Gaussian mechanisms of L2 sensitivity 1 that "
                  "compose to one at σ₀ = " if r.get("centre_share") else
                  ", one Gaussian mechanism on a weighted vector of L2 sensitivity 1, σ₀ = ")
               + f"{_fmt(r['class_stats_noise_multiplier'])}" + (")" if r.get("centre_share") else "")
               + f", costing ε = {_fmt(r.get('class_stats_epsilon'))} alone"
               + (f", charged {r['class_stats_releases']} times per client (rerun after an interruption)"
                  if (r.get("class_stats_releases") or 1) > 1 else "")
               if r.get("class_stats_noise_multiplier") else "") + f"){over}") if r["private"] else \
        "**NON-PRIVATE run (--no-dp): no differential-privacy guarantee**"
    eps_rows = [f"| {c['name']} | {c['id']} | {_fmt(c['epsilon'])} |" for c in r.get("client_epsilons") or []]
    lines = [
        "# fedhype report", "", "## At a glance", "", *glance(r),
        share_line(r["private"], conf["train"].get("seed") is not None), "", "## Details", "",
        f"Data: {r['n_real']} real images → {r['dim']}-d embeddings ({r['encoder']}); clients: "
        + ", ".join(f"{n} ({s})" for n, s in zip(r["clients"], r["client_sizes"])) + ".",
        *([""] + [f"- data warning: {w}" for w in r["data_warnings"]] if r.get("data_warnings") else []),
        "", f"Privacy: {priv}.", "", *_model_line(r.get("model"), r.get("traffic")),
        *([f"Secure aggregation: {r['secure_aggregation']['trust']}.", ""] if r.get("secure_aggregation") else []),
        f"Synthetic: {r['n_synthetic']} embeddings from code `{r['code']}`"
        + (f" ({r['codes_note']})" if r.get("codes_note") else "")
        + (f"; class means anchored: {r['anchor']}" if r.get("anchor", "off") != "off" else "")
        + _share_clause(r.get("release_choices")) + ".", "",
        *(["| client | ledger id | ε (at δ) |", "|---|---|---|", *eps_rows, ""] if r["private"] and eps_rows else []),
        "## Fidelity (synthetic vs held-out real test embeddings, L2-normalised)", "",
        "| MMD² | p-value | FD | precision | recall | density | coverage |", "|---|---|---|---|---|---|---|",
        "| " + " | ".join(_fmt(r[k]) for k in ("mmd2", "mmd2_p_value", "fd", "precision", "recall", "density", "coverage")) + " |",
        "", "## Utility (logistic regression, tested on real held-out data)", "",
        "| | accuracy | balanced accuracy | macro-F1 |", "|---|---|---|---|",
        f"| TSTR (train on synthetic) | {_fmt(r['tstr_accuracy'])} | {_fmt(r['tstr_balanced_accuracy'])} | {_fmt(r['tstr_macro_f1'])} |",
        f"| TRTR (train on real, non-private reference) | {_fmt(ev.get('trtr_accuracy'))} | {_fmt(ev.get('trtr_balanced_accuracy'))} | {_fmt(ev.get('trtr_macro_f1'))} |",
        f"| chance (a constant guess of the most frequent of {r.get('n_classes') or '?'} classes) | "
        f"{_fmt(r.get('majority_share') or (1.0 / r['n_classes'] if r.get('n_classes') else None))} | "
        f"{_fmt(1.0 / r['n_classes']) if r.get('n_classes') else '–'} | – |",
        "", "TSTR is the useful figure: how well a classifier trained only on the shared synthetic data does on real "
            "data, between chance and TRTR. " + (
                "For the same ε, `--method dp-gaussian` (the one-shot statistics alone) is the floor a trained "
                "generator must beat." if r.get("rounds") else
                (f"This model is the one-shot statistics release itself, with no DP-SGD round: {r['dp_sgd_stage_off']}."
                 if r.get("dp_sgd_stage_off") else
                 "This model is the one-shot statistics release itself, with no DP-SGD round (`--method "
                 f"{r.get('method')}`).")),
    ]
    if r.get("interpolation_mean_accuracy") is not None:
        lam = r["interpolation_mean_lambda"]
        say = ("λ = 1 means every client kept its own real-data classifier alone: mixing in the synthetic one did not "
               "help on its validation split" if lam is not None and lam >= 1 - 1e-9 else
               "λ = 0 would be the synthetic classifier alone, λ = 1 the client's own real-data classifier alone; "
               "below 1, the synthetic data helped the clients' own classifiers")
        lines += ["", f"Predecessor's per-client protocol (λ·p_local + (1−λ)·p_synthetic, λ chosen on validation): "
                      f"mean accuracy {_fmt(r['interpolation_mean_accuracy'])}, mean λ {_fmt(lam)} ({say})."]
    if r.get("downstream"):
        lines += _downstream_lines(r["downstream"])
    if r.get("prototypes"):
        p = r["prototypes"]
        lines += ["", "## Downstream: hyper-prototype classifier vs linear probe (trained on synthetic)", "",
                  "| classifier | accuracy | balanced accuracy | macro-F1 |", "|---|---|---|---|",
                  f"| hyper-prototypes | {_fmt(p.get('hyperproto_accuracy'))} | {_fmt(p.get('hyperproto_balanced_accuracy'))} | {_fmt(p.get('hyperproto_macro_f1'))} |",
                  f"| linear probe | {_fmt(p.get('linear_probe_accuracy'))} | {_fmt(p.get('linear_probe_balanced_accuracy'))} | {_fmt(p.get('linear_probe_macro_f1'))} |"]
    if r.get("dp_fedavg_linear_accuracy") is not None:
        eps = (f"its own ε = {_fmt(r['dp_fedavg_linear_epsilon'])} at δ = {r['dp_fedavg_linear_delta']} (PRV, worst "
               "client) — a separate release from the generator's ε above; a client in both spends both"
               if r["dp_fedavg_linear_private"] else "NON-PRIVATE (--no-dp)")
        lines += ["", f"## Reference: {'DP-SGD' if r['dp_fedavg_linear_private'] else 'non-private'} FedAvg linear "
                      "classifier on the clients' real embeddings", "",
                  f"Trained directly on the real training records ({eps}); tested on the same held-out real set.", "",
                  "| | accuracy | balanced accuracy | macro-F1 |", "|---|---|---|---|",
                  f"| {'DP ' if r['dp_fedavg_linear_private'] else ''}FedAvg logistic regression | "
                  f"{_fmt(r['dp_fedavg_linear_accuracy'])} | "
                  f"{_fmt(r['dp_fedavg_linear_balanced_accuracy'])} | {_fmt(r['dp_fedavg_linear_macro_f1'])} |"]
    cd = r.get("code_domain")
    if cd:
        head = "| code | " + " | ".join(cd["domains"]) + " |"
        lines += ["", "## Code × domain (MMD² ↓ / TSTR ↑ of each code's samples against each client's real test split)", "",
                  _code_domain_sentence(cd), "",
                  head, "|---|" + "---|" * len(cd["domains"])]
        for code, mrow, trow in zip(cd["codes"], cd["mmd2"], cd["tstr"]):
            lines.append(f"| {code} | " + " | ".join(f"{_fmt(a, 3)} / {_fmt(b, 3)}" for a, b in zip(mrow, trow)) + " |")
        lines += ["", "![code × domain](plots/code_domain.png)"]
    per = ev.get("per_domain") or {}
    if per:
        lines += ["", "## Per domain (TSTR / TRTR accuracy)", "", "| domain | TSTR | TRTR |", "|---|---|---|"]
        for name, d in per.items():
            lines.append(f"| {name} | {_fmt(d.get('tstr_accuracy'))} | {_fmt(d.get('trtr_accuracy'))} |")
    timing_lines = [" · ".join(f"{k[:-2]} {v:.1f}" for k, v in r["timings_s"].items())]
    if r.get("timings_earlier_s"):  # an interrupted job resumed (or a finished one rerun) into this folder
        runs = r.get("timings_earlier_runs") or [{} for _ in r["timings_earlier_s"]]
        timing_lines = [f"- this run: {timing_lines[0]}"] + [
            f"- earlier run {i + 1}{_stopped(run)}: "
            + (" · ".join([*(f"{k[:-2]} {v:.1f}" + (" (interrupted)" if k == run.get("interrupted") else "")
                             for k, v in st.items()),
                           # a killed run's stage has no time (StageTimings: no handler ran)
                           *([f"{run['interrupted'][:-2]} (interrupted)"]
                             if run.get("interrupted") and run["interrupted"] not in st else [])])
               or "no stage finished")
            for i, (st, run) in enumerate(zip(r["timings_earlier_s"], runs))]
    lines += ["", "## Timings (s)", "", *timing_lines,
              "", "![projection](plots/projection.png)", "",
              "The projection (PCA fit on the held-out real test records, which it plots beside the synthetic "
              "ones) shows real records: like the diagnostics below, it is for the data holder's eyes only.", "",
              *(["![training](plots/training.png)", "",
                 "Per-round −ELBO/MMD² curves are held-out diagnostics computed on validation records; they are not "
                 "covered by the DP guarantee and are for the data holder's eyes." + _trend_sentence(r.get("held_out_not_dp")),
                 ""] if r.get("rounds") else []),
              f"_fedhype {r['fedhype_version']}, {r['date']}, {r['machine']}_", ""]
    return "\n".join(lines)
