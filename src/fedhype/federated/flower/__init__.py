"""Multi-machine training on Flower's deployment engine (optional extra ``fedhype[flower]``).

One SuperLink (the server's machine) and one SuperNode per institution. The ServerApp and
ClientApp (:mod:`.apps`) call the same client DP step and server aggregation as the in-process
engine, through :func:`fedhype.federated.engine.run_federation` and a
:class:`~fedhype.federated.transport.ClientTransport` (:mod:`.grid_transport`); only the records of
:mod:`.wire` cross the network: θ_i and public settings to a node, PrivatizedUpdates back.
:mod:`.federation` writes the public files the server reads and the Flower App folder.
See ``docs/flower.md``. Importing a submodule needs ``flwr`` installed; this package does not.
"""
