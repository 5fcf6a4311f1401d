"""Check a SuperNode's ``--node-config`` before starting the SuperNode.

Flower gives an app no hook at SuperNode start (flwr 1.42: ``flower-supernode`` keeps ``--node-config`` as a mapping,
and the ClientApp, its lifespan included, first runs when a run's first message arrives), so a node started with a
wrong path only fails when the coordinator runs. A site's operator runs this first, with the same node config::

    python -m fedhype.federated.flower.check --node-config 'site="/data/site" federation="/data/federation.json"
                                                           state-dir="/data/fedhype-state"'

It runs the checks of the node's identity handshake that need no server, without a SuperLink and without writing
anything, and prints each one:

* the keys (:meth:`~fedhype.federated.flower.handshake.NodeSettings.from_node_config`: an unknown key is named with
  the closest known one);
* the paths (:func:`~fedhype.federated.flower.handshake.check_node_paths`: the site folder, the federation file, the
  store and partition of a pooled-partition node, a writable ``state-dir``);
* the node's place in the federation (:func:`~fedhype.federated.flower.handshake.site_place`: its site in the
  roster, with its key, size and classes; or its client in the partition);

and for a site node:

* its site ledger across runs (``site-ledger.json``): intact (hash chain), this site's, there where ``site.json``
  says ``fedhype site`` started it (:func:`~fedhype.privacy.site_ledger.load_site_ledger`);
* the run binding in ``<state-dir>/federation-runs.json`` (:mod:`~fedhype.federated.flower.node_budget`): whether
  this federation file is already bound to a run, and which;
* the federation's whole plan for its client (the release and every planned round; ε = ∞ for a plan without DP or a
  seeded node) composed with the site's ledger against its lifetime cap
  (:func:`~fedhype.federated.flower.node_budget.refuse_site_plan`: the handshake's own check; for a bound file, as
  the resume of its run).

What needs the server is checked when it connects: at the handshake, the run key of its query (a new run is refused
with a federation file already bound to a run; the bound run's resume is served); at every task, the server's
federation digest, σ against ``min-noise-multiplier`` and ``allow-no-dp``, and the node's own ledger of the run.
Exit 0 with the client the node holds; exit 2 naming what the handshake would refuse and what to do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedhype.errors import FedhypeError


def check(nc: dict) -> str:
    """The client id a node with node config ``nc`` holds, after the checks above (:func:`check_report`)."""
    return check_report(nc)[0]


def check_report(nc: dict) -> tuple[str, list[str]]:
    """``(client id, what was checked: one line each)`` of a node with node config ``nc``.

    Raises:
        NodeConfigError: a path is not there (or ``state-dir`` is not writable).
        ValidationError / ArtifactError / NodeMismatch / NodeRefusal: a bad or unknown key, an unreadable or wrong
            file, a site not in the federation, an edited or missing site ledger, a plan past the site's cap
            (:class:`PlanRefused`, with the figures).
    """
    from fedhype.federated.flower.handshake import NodeSettings, check_node_paths, site_place

    node = NodeSettings.from_node_config(nc)  # an unknown key: named, with the closest known key
    done = [f"keys: {', '.join(map(str, nc))} ({'a site node' if node.site is not None else 'a pooled-partition node'})"]
    check_node_paths(node)
    done.append("paths: " + (f"site folder {node.site}, federation file {node.federation}" if node.site is not None
                             else f"embeddings store {node.embeddings}, partition file {node.partition}")
                + f", state-dir {node.state_dir} (writable)")
    if node.site is None:
        raw = json.loads(node.partition.read_text(encoding="utf-8"))
        clients = [(str(c["id"]), str(c["name"])) for c in raw["clients"]]
        client = clients[node.client_index(clients)][0]
        done.append(f"place: client {client} of the partition")
        return client, done
    cid, _, _ = site_place(node)
    client = str(cid)
    done.append(f"place: client {client} of the federation (the roster carries this site's key, training-set size "
                "and classes)")
    done.extend(_site_checks(node, client))
    return client, done


class PlanRefused(FedhypeError):
    """The handshake would refuse the federation's plan on this site's ledger (the figures are local: this is the
    site operator's checker)."""


def _site_checks(node, client: str) -> list[str]:
    """The site ledger, the run binding and the plan against the site's cap (the handshake's functions)."""
    import logging

    from fedhype.data.sites import Site
    from fedhype.federated.flower.handshake import NodeRefusal, own_federation
    from fedhype.federated.flower.node_budget import BINDINGS, _bindings, refuse_site_plan
    from fedhype.privacy.site_ledger import cap_of, ledger_path, load_site_ledger, spent

    done = []
    site = Site.load(node.site)
    led = load_site_ledger(site.folder, expected=site.ledger, site=site.name)  # missing / edited / another site's
    cap = cap_of(led)
    done.append(f"site ledger: {ledger_path(site.folder)} " + (
        "not started yet (a site folder of an earlier version; the first charge starts it)" if led is None else
        f"intact, ε = {spent(led):.4f} at δ = {led.delta:g} spent over its runs, "
        + ("no cap (it records, refuses nothing)" if cap is None else f"cap {cap:g}")))
    bound = _bindings(node).get(own_federation(node))  # an unreadable bindings file raises
    done.append(f"run binding: {Path(node.state_dir) / BINDINGS}: " + (
        "this federation file is not bound to a run yet (the first run the node serves binds it)" if bound is None
        else f"this federation file is bound to run {bound}: the node serves only its resume, and refuses a new "
             "run with this file (the run key comes with the server's query: checked at the handshake)"))
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("fedhype.federated.flower.node_budget")
    keep = _Keep(logging.WARNING)
    logger.addHandler(keep)
    try:
        refuse_site_plan(node, client, bound or "")
    except NodeRefusal as exc:
        figures = "; ".join(r.getMessage().split(": ", 1)[-1] for r in records)
        raise PlanRefused(f"the identity handshake would refuse: {exc}" + (f". At the site: {figures}" if figures
                                                                           else "")) from None
    finally:
        logger.removeHandler(keep)
    from fedhype.federated.flower.federation import Federation

    cfg = Federation.load(node.federation).train
    what = ("a plan without DP (ε = ∞)" if cfg.no_dp else "a seeded node (ε = ∞ for the site)"
            if node.seed is not None else "the federation's plan (the release and every planned round)")
    done.append(f"plan: {what}" + (f", {'as the resume of run ' + bound if bound else 'as a new run'}, composed with "
                                   f"the site's ledger, fits under its cap {cap:g}" if cap is not None else
                                   ": the site has no cap, so nothing is refused (its ledger records it)"))
    return done


def main(argv: list[str] | None = None) -> int:
    from flwr.common.config import parse_config_args

    from fedhype.federated.flower.handshake import NodeConfigError

    parser = argparse.ArgumentParser(prog="python -m fedhype.federated.flower.check",
                                     description="Check a SuperNode's --node-config before starting the SuperNode.")
    parser.add_argument("--node-config", required=True, help="the node config flower-supernode is given")
    args = parser.parse_args(argv)
    try:
        nc = parse_config_args([args.node_config])
    except Exception as exc:  # noqa: BLE001 - flwr raises ValueError, or click's exception over a TOML error
        # (a helper's unquoted paths printed a traceback); the values are TOML: strings go in double quotes
        text = getattr(exc, "message", None) or str(exc)
        print(f"--node-config is not key=value pairs with TOML values ({' '.join(text.split())}); a path is a string "
              "and goes in double quotes: --node-config 'site=\"/data/site\" federation=\"/data/fed/federation.json\" "
              "state-dir=\"/data/fedhype-state\"'", file=sys.stderr)
        return 2
    try:
        client, done = check_report(nc)
    except NodeConfigError as exc:
        print(exc.detail, file=sys.stderr)
        return 2
    except (FedhypeError, KeyError, TypeError, ValueError, OSError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print("checked (what the identity handshake checks without the server):")
    for line in done:
        print(f"  {line}")
    print("checked when the server connects: the run key of its query (at the handshake); the server's federation "
          "digest, σ against min-noise-multiplier and allow-no-dp, the node's own ledger of the run (at every task)")
    print(f"node config ok: this SuperNode holds client {client}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
