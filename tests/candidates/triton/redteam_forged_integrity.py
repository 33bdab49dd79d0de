"""Red team: the worker's own reports, rewritten and re-signed by the candidate (defence in depth).

The runner signs its answers with a key held in a ``Channel`` object of the candidate's process (the
integrity check watches the worker and its link, not the channel). The candidate finds it through gc
and replaces the channel's reply file with a writer that rewrites every ``Serve`` and ``Integrity``
answer to a clean one and signs it again. Then it does what those reports exist to catch: it replaces
the worker's call path (``worker.ops``, "the worker.ops was replaced") and leaves a thread running
("left threads running"). The harness must still reject it: it cannot, since every such finding is
the worker's own word; this test documents that the integrity, thread, process and mode checks are
void against a candidate that reaches the channel."""

import gc
import hashlib
import hmac
import json
import sys
import threading
import time

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "_key"))
_CLEAN = {"changes": [], "new_threads": [], "processes": [], "modes": []}


class _Rewriter:
    def __init__(self, inner, key):
        self.inner, self.key = inner, key

    def write(self, line):
        text, _, _ = line.rstrip("\n").rpartition("\t")
        reply = json.loads(text)
        body = reply.get("body") or {}
        if set(_CLEAN) <= set(body):  # an IntegrityAnswer
            body.update(_CLEAN)
        elif {"threads", "processes", "modes"} <= set(body):  # a ServeAnswer
            body.update(threads=[], processes=[], modes=[])
        text = json.dumps(reply)
        mac = hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()[:32]
        return self.inner.write(f"{text}\t{mac}\n")

    def flush(self):
        return self.inner.flush()


_channel._reply = _Rewriter(_channel._reply, _channel._key)
_call = _worker.ops.call
_worker.ops = _worker.ops._replace(call=lambda worker, go, fds: _call(worker, go, fds))
threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
