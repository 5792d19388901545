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


#: the tensor dtypes a message may name (anything else is a malformed message, never getattr'd blindly)
DTYPES = {"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
          "complex64", "complex128"}


def _decode(obj):
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            import torch
            if obj.get("dtype") not in DTYPES:
                raise ValueError(f"a tensor of unknown dtype {str(obj.get('dtype'))[:40]!r}")
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
    """The next message; ``ValueError`` if it is not one the grader can read (a rank running
    student code may write anything on its socket: it costs that rank's report, never the grader)."""
    data = conn.recv_bytes(MAX_MESSAGE_BYTES + 1024)
    try:
        msg = _decode(json.loads(data.decode()))
    except (ValueError, TypeError, KeyError, RecursionError, RuntimeError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed message ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise ValueError("malformed message (not an object)")
    return msg
