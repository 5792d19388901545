"""What travels between rank processes and the grader: JSON, with tensors as nested lists.

JSON and not pickle on purpose: the grader must never unpickle bytes that a process running
student code produced (unpickling can execute code). Tensors become
``{"__tensor__": [...], "dtype": "float32"}``; everything else that JSON cannot hold becomes its
``str``. Messages are capped so that a runaway payload cannot exhaust the grader's memory.
"""

from __future__ import annotations

import json
import math

MAX_MESSAGE_BYTES = 16 << 20


def _encode(obj):
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return {"__tensor__": t.tolist(), "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    return str(obj)


def _decode(obj):
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            import torch
            return torch.tensor(obj["__tensor__"], dtype=getattr(torch, obj["dtype"])).reshape(obj["shape"])
        if "__float__" in obj:
            return float(obj["__float__"])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def send(conn, msg: dict) -> None:
    data = json.dumps(_encode(msg)).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        data = json.dumps({k: v for k, v in _encode(msg).items() if k != "payload"}
                          | {"status": "error", "message": f"the check's payload was too large ({len(data)} bytes)"}).encode()
    conn.send_bytes(data)


def recv(conn) -> dict:
    return _decode(json.loads(conn.recv_bytes(MAX_MESSAGE_BYTES + 1024).decode()))
