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
