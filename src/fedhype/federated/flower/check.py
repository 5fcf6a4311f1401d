"""Check a SuperNode's ``--node-config`` before starting the SuperNode.

Flower gives an app no hook at SuperNode start (flwr 1.42: ``flower-supernode`` keeps ``--node-config`` as a mapping,
and the ClientApp, its lifespan included, first runs when a run's first message arrives), so a node started with a
wrong path only fails when the coordinator runs. A site's operator runs this first, with the same node config::

    python -m fedhype.federated.flower.check --node-config 'site="/data/site" federation="/data/federation.json"
                                                           state-dir="/data/fedhype-state"'

It checks what the node's identity handshake checks, without a SuperLink and without releasing anything: the keys
(:meth:`~fedhype.federated.flower.handshake.NodeSettings.from_node_config`), the paths
(:func:`~fedhype.federated.flower.handshake.check_node_paths`: the site folder, the federation file, the store and
partition of a pooled-partition node, a writable ``state-dir``) and the node's place in the federation
(:func:`~fedhype.federated.flower.handshake.site_place`, or its client in the partition). Exit 0 with the client the
node holds; exit 2 naming each key, its path and what to do.
"""

from __future__ import annotations

import argparse
import json
import sys

from fedhype.errors import FedhypeError


def check(nc: dict) -> str:
    """The client id a node with node config ``nc`` holds, after the checks above.

    Raises:
        NodeConfigError: a path is not there (or ``state-dir`` is not writable).
        ValidationError / ArtifactError / NodeMismatch: a bad key, an unreadable file, a site not in the federation.
    """
    from fedhype.federated.flower.handshake import NodeSettings, check_node_paths, site_place

    node = NodeSettings.from_node_config(nc)
    check_node_paths(node)
    if node.site is not None:
        return str(site_place(node)[0])
    raw = json.loads(node.partition.read_text(encoding="utf-8"))
    return [str(c["id"]) for c in raw["clients"]][node.client_index([(str(c["id"]), str(c["name"]))
                                                                       for c in raw["clients"]])]


def main(argv: list[str] | None = None) -> int:
    from flwr.common.config import parse_config_args

    from fedhype.federated.flower.handshake import NodeConfigError

    parser = argparse.ArgumentParser(prog="python -m fedhype.federated.flower.check",
                                     description="Check a SuperNode's --node-config before starting the SuperNode.")
    parser.add_argument("--node-config", required=True, help="the node config flower-supernode is given")
    args = parser.parse_args(argv)
    try:
        nc = parse_config_args([args.node_config])
    except ValueError as exc:
        print(f"--node-config is not key=value pairs: {exc}", file=sys.stderr)
        return 2
    try:
        client = check(nc)
    except NodeConfigError as exc:
        print(exc.detail, file=sys.stderr)
        return 2
    except (FedhypeError, KeyError, TypeError, ValueError, OSError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"node config ok: this SuperNode holds client {client}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
