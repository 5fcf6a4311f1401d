"""``fedhype site``: one institution splits its own records and writes what it may tell the coordinator.

Writes a site folder (:mod:`fedhype.data.sites`): ``site.json`` (private to the site: its record ids
per split, its store) and ``card.json`` (public: name, random site key, number of training records,
encoder, class names). A federation of sites is then trained with ``fedhype train --site DIR ...``
in one process (a simulation), or on Flower with one SuperNode per site (docs/flower.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from fedhype.cli.common import (
    JobDefaultsCommand, JsonOpt, class_list, config_default, console, existing, kv_table, run_command, seed_value, warn)
from fedhype.errors import ValidationError


def _render(res: dict[str, Any]) -> None:
    Console().print(kv_table(f"fedhype site {res['name']}", {
        "site folder": res["site"], "private (keep at the site)": res["private"], "public card (send it)": res["card"],
        "train / val / test": f"{res['splits']['train']} / {res['splits']['val']} / {res['splits']['test']}",
        "classes": ", ".join(res["class_names"]),
        "ledger across runs (private)": f"{res['site_ledger']}: spent ε = "
                                        f"{'∞' if res['spent_epsilon_infinite'] else format(res['spent_epsilon'], '.4g')} at δ = "
                                        f"{res['delta']:g}, cap "
                                        + ("none (recorded only)" if res["max_epsilon"] is None else f"{res['max_epsilon']:g}")}))


def site(
    store: Path = typer.Option(..., "--store", help="This site's embeddings store (from `fedhype embed`).",
                               callback=existing("embeddings store", "create it with `fedhype embed`")),
    name: str = typer.Option(..., "--name", help="The site's name (letters, digits, '.', '_', '-'); it names the site "
                             "in every report."),
    out: Path = typer.Option(..., "--out", help="Site folder to write (site.json: private; card.json: public)."),
    fractions: str = typer.Option("0.6,0.2,0.2", "--fractions", help="train,val,test fractions of the site's records "
                                  "(per class; ignored for splits the image folders give)."),
    min_train: int = typer.Option(..., "--min-records", help="Refuse a split with fewer training records.",
                                  default_factory=config_default("partition", "min_records")),
    seed: int = typer.Option(0, "--seed", callback=seed_value, help="Seed of the split."),
    draw_splits: bool = typer.Option(False, "--draw-splits", help="Draw train/val/test from --fractions even when the "
                                     "store's image folders give splits (train/, val/, test/)."),
    classes: str | None = typer.Option(None, "--classes", help="The consortium's agreed class names, comma-separated "
                                       "(a superset of the site's): the card announces these instead of the site's "
                                       "own classes, so it does not say which classes the site holds."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing site folder (a new split and a new "
                                   "site key: runs trained on the old one no longer accept it; the old site.json is "
                                   "kept as site.<first 8 hex digits of the old key>.json for evaluating them). The folder's ledger across runs "
                                   "is kept: a store of other records than the previous split's is refused (give "
                                   "another --out), unless --same-records."),
    same_records: bool = typer.Option(False, "--same-records", help="With --overwrite and a --store other than the "
                                      "previous split's: the store shares records with it (re-embedded, moved, or "
                                      "images added, removed or changed), so the site's ledger across runs, their "
                                      "spending, is kept for it."),
    max_epsilon: Optional[float] = typer.Option(None, "--max-epsilon", help="The site's lifetime ε cap over all the "
                                                "runs its records take part in (its ledger across runs, "
                                                "site-ledger.json); `train --site` and the site's SuperNode refuse "
                                                "what would pass it. Change it later with `fedhype budget --site`."),
    delta: float = typer.Option(..., "--delta", default_factory=config_default("train", "delta"),
                                help="δ at which the site's ledger composes its runs (default: train's)."),
    json_mode: bool = JsonOpt,
) -> None:
    """Split this site's records into train/val/test locally; write its private split and its public card."""

    def body() -> dict[str, Any]:
        from fedhype.cli.partition_cmd import _parse_split
        from fedhype.data.partition import given_splits_line
        from fedhype.data.sites import CARD_FILE, SITE_FILE, make_site, site_splits
        from fedhype.data.store import EmbeddingStore

        from fedhype.cli.common import refuse_inside_release

        if out.exists() and not out.is_dir():
            raise ValidationError(f"--out {out} is a file; give a folder for the site")
        refuse_inside_release(out, "--out")  # a helper's site.json (record ids) was written into a release
        if out.is_dir() and any(out.iterdir()):
            if not (out / SITE_FILE).exists():
                from fedhype.data.sites import SITE_LEDGER_FILE

                if (out / SITE_LEDGER_FILE).is_file():  # a site folder that lost its site.json: its spend is here
                    if not (overwrite and same_records):
                        raise ValidationError(
                            f"--out {out} holds a site's ledger across runs ({out / SITE_LEDGER_FILE}: the spend of its "
                            f"records) but no {SITE_FILE}; restore {SITE_FILE} from a backup, or split again into this "
                            "folder with --overwrite --same-records (the ledger stays with these records). A new "
                            "folder would start them at ε = 0")
                else:
                    raise ValidationError(f"--out {out} is a folder of other files; give a new or empty folder for the site")
            elif not overwrite:
                raise ValidationError(f"--out {out} already holds a site; pass --overwrite to split again (new site key), "
                                      "or give another folder")
        splits = _parse_split(fractions)
        emb = EmbeddingStore.load(store)
        vocab = class_list(classes)
        s = make_site(emb, store, name, splits=splits, seed=seed, min_train=min_train, use_given_splits=not draw_splits,
                      classes=vocab)
        given = s.partition.params.get("given_splits")
        if given:
            console.print(given_splits_line(given, "--draw-splits draws every split instead"), highlight=False)
        if same_records and not overwrite:
            raise ValidationError("--same-records says that --store holds the records of the site folder being split "
                                  "again: give it with --overwrite")
        ledger_args = _ledger_args(out, name, max_epsilon, delta, len(s.split.train), store, emb.digest(),
                                   same_records, emb.sample_ids, emb)  # checked before anything is written
        s.ledger = True
        kept = None
        if (out / SITE_FILE).exists():  # --overwrite: keep the previous split (runs trained on it evaluate with it)
            import json
            import os

            try:
                old_key = str(json.loads((out / SITE_FILE).read_text(encoding="utf-8")).get("key", "old"))[:8]
            except (OSError, ValueError, AttributeError):
                old_key = "unreadable"
            kept = out / f"site.{old_key}.json"
            os.replace(out / SITE_FILE, kept)
            console.print(f"kept the previous split as {kept} (evaluate runs trained on it with --site {kept})",
                          highlight=False)
        s.save(out)
        console.print(f"wrote {out / SITE_FILE} (private) and {out / CARD_FILE} (public)", highlight=False)
        ledger = _site_ledger(out, name, *ledger_args)
        sizes = site_splits(s)
        # a probe's 3-image site split 2 / 1 / 0 without a word, and `evaluate --site` then failed on "MMD² needs at
        # least 2 samples"
        thin = [f"{k} {n}" for k, n in sizes.items() if k != "train" and n < 2]
        warnings = [f"site {name!r}: split(s) {', '.join(thin)} hold fewer than 2 records: `fedhype evaluate --site` "
                    "and `fedhype prototypes evaluate --site` score this site only on a split of at least 2 (give the "
                    "site more records, or other --fractions with --overwrite)"] if thin else []
        import torch

        from fedhype.pipeline.job import THIN_CLASS

        # `fedhype run` warned of a one-image class, `site` and `train --site` said nothing (a probe)
        counts = torch.bincount(s.partition.split_store(emb, "train").labels.long(), minlength=emb.n_classes).tolist()
        few = [f"{emb.class_names[k]!r} ({n})" for k, n in enumerate(counts) if 0 < n < THIN_CLASS]
        if few:
            warnings.append(f"site {name!r}: class(es) {', '.join(few[:8])}{' …' if len(few) > 8 else ''} have fewer "
                            f"than {THIN_CLASS} training records here: unless the other sites hold more of them, their "
                            "DP statistics are mostly noise and their synthetic embeddings will be poor")
        for w in warnings:
            warn(w)
        return {"site": str(out), "name": name, "private": str(out / SITE_FILE), "card": str(out / CARD_FILE),
                "splits": sizes, "class_names": list(emb.class_names), "given_splits": given, **ledger,
                "warnings": warnings}

    run_command(body, json_mode, _render)


#: --same-records: a record of the new store is one of the previous split's images where their embeddings (on the unit
#: sphere) are this close, and twice as close as to the next (:func:`fedhype.data.store.same_images`); the same image
#: embedded in bfloat16 and in float32 is ≤ 0.03 apart, two distinct digits of the bundled set ≥ 0.117
SAME_RECORD_TOL = 0.06


def _previous_store(out: Path, new_store) -> tuple:
    """The store the previous split of site folder ``out`` was made from, if it can still be read and its embeddings
    can be compared with ``new_store``'s (the same encoder, weights, pooling, preprocessing and D), else None, with
    why not (a phrase)."""
    from fedhype.data.sites import Site, encoder_of
    from fedhype.errors import FedhypeError

    try:
        prev = Site.load(out).store()
    except (FedhypeError, OSError, ValueError) as e:
        return None, f"the previous split's store cannot be read: {str(e).split(';')[0]}"
    if encoder_of(prev) != encoder_of(new_store):
        return None, "the previous split's store was embedded otherwise, so their embeddings cannot be compared"
    return prev, ""


def _ledger_args(out: Path, name: str, max_epsilon: float | None, delta: float, n_train: int, store: Path,
                 digest: str | None = None, same_records: bool = False, sample_ids=None, new_store=None) -> tuple:
    """Check the site ledger's settings before anything is written: ``(max_epsilon or KEEP, δ or None, expected)``.

    A new site starts its ledger at ``delta``; a site split again (--overwrite) keeps its ledger, its δ unless
    --delta is given, and its cap unless --max-epsilon is; its name cannot change (the ledger is the records').
    The ledger is the previous split's records': a store (``digest``) other than the one the previous split was
    made from is refused while the ledger holds charges, unless ``same_records`` (--same-records: the same records
    re-embedded); a larger δ under a cap needs the cap restated. With ``same_records`` the records ``new_store`` (the
    loaded --store) shares with the previous split are counted by their embeddings where the previous split's store
    can be read and was embedded alike (:data:`SAME_RECORD_TOL`), else by their ids (relative file names), and none
    shared is refused.

    Raises:
        ValidationError: a bad cap or δ, a cap below what was spent, a new name for a site with a ledger, a store
            of other records, a larger δ under a cap without --max-epsilon.
        ArtifactError: the old site's ledger is missing though started, corrupt, or another site's.
    """
    import json

    import click

    from fedhype.data.sites import SITE_FILE
    from fedhype.privacy.accountant import delta_advice, validate_target_epsilon
    from fedhype.privacy.site_ledger import (KEEP, check_delta, check_delta_change, composed, eps_text, infinite_reason,
                                             load_site_ledger, site_of)

    if max_epsilon is not None:
        validate_target_epsilon(max_epsilon, "--max-epsilon")
    explicit = click.get_current_context().get_parameter_source("delta") in (
        click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    check_delta(delta, n_train)
    if (advice := delta_advice(delta, {name: n_train})) is not None:  # as `fedhype budget` and `fedhype train` warn
        warn(advice)
    previous: dict = {}  # the split --overwrite replaces: did it start a ledger, which store did it name
    if (out / SITE_FILE).exists():
        try:
            previous = dict(json.loads((out / SITE_FILE).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            previous = {}
    expected, old_store = bool(previous.get("site_ledger")), previous.get("store")
    old_digest = (previous.get("partition") or {}).get("store_digest") if isinstance(previous.get("partition"), dict) else None
    old = load_site_ledger(out, expected=expected)
    other = old_digest is None or digest is None or old_digest != digest  # the store the previous split was made from?
    if old is not None and len(old) and other and not same_records:
        same_path = old_store is not None and Path(str(old_store)).resolve() == Path(store).resolve()
        was = ("the same path, but its records changed since: re-embedded or replaced" if same_path else
               f"{old_store}" if old_store is not None else "unknown: its site.json is unreadable")
        raise ValidationError(
            f"--store {store} is not the store the previous split of {out} was made from ({was}), and the folder's "
            f"ledger across runs ({out / 'site-ledger.json'}, {len(old)} charge(s)) is those records' spending: kept "
            "for other records, they would carry that spend and the previous records would lose their ledger. "
            "Nothing was written. If this store shares any record with the previous one (re-embedded, moved, or "
            "images added, removed or changed), add --same-records: the ledger, and the spend its records carry, is "
            "kept (a new --out would start them at ε = 0); give another --out only for a site of entirely other "
            "records")
    if old is not None and other and same_records:
        # what the two share, by the previous split's record ids (a probe moved one site's ledger onto another site's
        # records with --same-records, and nothing said that they shared none)
        from fedhype.data.store import opaque_id

        clients = (previous.get("partition") or {}).get("clients") if isinstance(previous.get("partition"), dict) else None
        before = {str(i) for c in clients or [] if isinstance(c, dict) for k in ("train", "val", "test")
                  for i in (c.get(k) or [])}
        now = {opaque_id(str(i)) for i in sample_ids} if sample_ids is not None else set()
        shared = len(before & now)
        # ids are relative file names: another site's `one/000.png` is not this site's (a helper moved site_a's ledger
        # onto site_b's images, "220 of its 221 records are among the previous split's"); where the previous split's
        # store can still be read, the records are matched by their embeddings
        prev, why = _previous_store(out, new_store) if new_store is not None else (None, "no store to compare")
        if prev is not None:
            from fedhype.data.store import same_images

            same = same_images(new_store, prev, SAME_RECORD_TOL)
            if not same:
                raise ValidationError(
                    f"--same-records: --store {store} holds none of the {len(prev):,} images of the previous split of "
                    f"{out} (no embedding within {SAME_RECORD_TOL} of one of theirs on the unit sphere and closer to it "
                    "than half the distance to the next"
                    + (f"; {shared:,} of its record names are theirs, but names alone do not make the same records"
                       if shared else "") + "): its ledger across runs is those records' spending and cannot be kept "
                    "for other records (nothing was written). Give another --out for a site of other records, or the "
                    "store of this site's records")
            console.print(f"--same-records: the site's ledger across runs is kept for the records of --store {store} "
                          f"(the previous split's store: {old_store}); {same:,} of its {len(new_store):,} records are "
                          f"images of the previous split's {len(prev):,} (by their embeddings)",
                          highlight=False, soft_wrap=True)  # one line: what it says is read, and tested
        else:
            if before and sample_ids is not None and not shared:
                raise ValidationError(
                    f"--same-records: --store {store} holds none of the {len(before):,} records of the previous split of "
                    f"{out} (by their ids): its ledger across runs is those records' spending and cannot be kept for "
                    "other records (nothing was written). Give another --out for a site of other records, or the store "
                    "of this site's records")
            console.print(f"--same-records: the site's ledger across runs is kept for the records of --store {store} "
                          f"(the previous split's store: {old_store})"
                          + (f"; {shared:,} of its {len(now):,} records are among the previous split's {len(before):,}"
                             f" by their names only ({why}): make sure they are the same images"
                             if before and sample_ids is not None else ""), highlight=False, soft_wrap=True)
    if old is not None and site_of(old) != name:
        raise ValidationError(f"--name {name}: this site folder's ledger across runs is site {site_of(old)!r}'s (the "
                              f"spending of these records); keep --name {site_of(old)}, or give another --out for a new "
                              "site")
    if explicit:
        check_delta_change(old, delta, KEEP if max_epsilon is None else float(max_epsilon))
    if old is not None and max_epsilon is not None:
        now = composed(old.events, delta if explicit else old.delta)
        if math.isinf(now):  # "give a larger cap" was wrong: no finite cap can hold (as set_site_ledger says)
            raise ValidationError(f"--max-epsilon {max_epsilon:g}: site {name!r}: {infinite_reason(old)} "
                                  f"({out / 'site-ledger.json'}: ε = ∞), so no finite cap can hold; the site can only "
                                  "record further runs (no cap); nothing was written")
        if now > max_epsilon:
            raise ValidationError(f"--max-epsilon {max_epsilon:g}: site {name!r} has already spent ε = {eps_text(now)} over its "
                                  f"runs ({out / 'site-ledger.json'}); give a larger cap (nothing was written)")
    return (KEEP if max_epsilon is None else float(max_epsilon),
            delta if (old is None or explicit) else None, expected)


def _site_ledger(out: Path, name: str, max_epsilon, delta: float | None, expected: bool) -> dict[str, Any]:
    """Start the site's ledger across runs, or keep it through --overwrite (a new split of the same records has
    their spending behind it) with the cap and δ :func:`_ledger_args` checked."""
    from fedhype.privacy.site_ledger import cap_of, ledger_path, load_site_ledger, set_site_ledger, spent

    old = load_site_ledger(out, expected=expected)
    if old is not None:
        console.print(f"kept the site's ledger across runs, {ledger_path(out)}: its records have spent ε = "
                      f"{spent(old):.4g} at δ = {old.delta:g} over earlier runs", highlight=False)
    led = set_site_ledger(out, name, max_epsilon=max_epsilon, delta=delta, expected=expected)
    eps = spent(led)
    return {"site_ledger": str(ledger_path(out)), "max_epsilon": cap_of(led), "delta": led.delta,
            "spent_epsilon": None if math.isinf(eps) else eps, "spent_epsilon_infinite": math.isinf(eps)}


def register(app: typer.Typer) -> None:
    app.command("site", cls=JobDefaultsCommand)(site)
