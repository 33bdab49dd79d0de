"""Red team: making the harness raise by a correctly signed answer that the JSON decoder cannot read.

The worker signs its answers with a key its runner keeps in a ``Channel`` object of the candidate's own
process (found here through gc). A forged answer line carrying the right mac passes the harness's check
and goes to ``protocol.decode``, which catches ValueError and UnicodeDecodeError from ``json.loads`` but
not the RecursionError of a deeply nested array: it escapes ``Child.receive``, ``Job.ask`` and
``evaluate()``, and the pool answers the exception with ``fault="evaluator"`` (no -1). The harness must
answer: rejected, the candidate's fault, and never raise."""

import gc
import hashlib
import hmac

import torch.nn as nn

from kernels.relu_add import relu_add

_channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "_key"))
_depth = 200_000
_text = '{"type": "Reply", "ok": true, "body": {"error": ' + "[" * _depth + "]" * _depth + "}}"
_mac = hmac.new(_channel._key, _text.encode(), hashlib.sha256).hexdigest()[:32]
_channel._reply.write(f"{_text}\t{_mac}\n")
_channel._reply.flush()


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
