"""A stand-in for Flower's ``Grid`` in process: pushed messages get ids, and each pull answers them through the
subclass's ``answer`` (its content, or a ClientApp error as Flower reports one). No SuperLink, no processes."""

from __future__ import annotations

from types import SimpleNamespace


class NodeError(Exception):
    """Raised by ``answer``: the node's reply is a ClientApp error with this reason (Flower's wording)."""


class InboxGrid:
    def __init__(self):
        self._next, self._inbox = 0, {}

    def answer(self, message):  # pragma: no cover - every fake grid defines it
        raise NotImplementedError

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            self._next += 1
            ids.append(str(self._next))
            self._inbox[str(self._next)] = m
        return ids

    def pull_messages(self, ids):
        from flwr.common.constant import ErrorCode

        out = []
        for i in ids:
            meta = SimpleNamespace(reply_to_message_id=i)
            try:
                content = self.answer(self._inbox.pop(i))
            except NodeError as exc:
                err = SimpleNamespace(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(exc))
                out.append(SimpleNamespace(metadata=meta, has_error=lambda: True, has_content=lambda: False,
                                           error=err, content=None))
                continue
            out.append(SimpleNamespace(metadata=meta, has_error=lambda: False, has_content=lambda: True, error=None,
                                       content=content))
        return out


def set_task_identity(monkeypatch) -> None:
    """Messages are built inside a ServerApp run in production; give them a run, task and node id (1) here."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)


def two_site_folders(store, root):
    """Two sites of ``store`` (an iid split of it, partition seed 0: each its own store file and split, as
    ``fedhype site`` writes them) in folders ``root/site0`` and ``root/site1``; returns the two folder paths."""
    from fedhype.data.partition import make_partition
    from fedhype.data.sites import make_site

    part = make_partition(store, scheme="iid", n_clients=2, seed=0)
    out = []
    for i, c in enumerate(part.clients):
        own = store.subset(store.positions(c.train + c.val + c.test))
        own.save(root / f"site{i}.safetensors")
        out.append(make_site(own, root / f"site{i}.safetensors", f"site-{i}", seed=i).save(root / f"site{i}"))
    return out
