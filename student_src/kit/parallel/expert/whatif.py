"""What if: expert parallelism x data parallelism against replicating every expert on every rank (plain data
parallelism of the MoE model), for one model and W ranks: per rank the bytes of parameters, gradients and AdamW
state (16 bytes a parameter in fp32), and the bytes a step sends.

* replicated (EP 1): every rank holds all E experts; a step all_reduces every gradient over W ranks
  (a ring: ``2 (W - 1) / W`` of the bytes);
* EP P x DP W/P: a rank holds E/P experts; a step all_reduces the rest over W ranks and its experts over its
  W/P replicas, and sends the all-to-alls of ``traffic.uniform_layer_bytes`` per MoE layer.

EP wins memory always (the experts / P), and wins traffic when the experts' gradients saved exceed the
all-to-alls' activations: big experts, few tokens a step. ``compare`` gives both rows.
"""

from __future__ import annotations

from student_src.kit.parallel.expert.traffic import uniform_layer_bytes


def _ring(nbytes: float, n: int) -> float:
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def compare(expert_params: int, other_params: int, layers: int, num_experts: int, top_k: int, world: int,
            ep_size: int, tokens_per_rank: int, hidden: int) -> list[dict]:
    """Two rows (replicated, EP x DP): ``memory_bytes`` and ``step_bytes`` per rank (fp32, AdamW)."""
    rows = []
    for p in (1, ep_size):
        held = expert_params / p + other_params
        grads = _ring(4 * other_params, world) + _ring(4 * expert_params / p, world // p)
        a2a = layers * uniform_layer_bytes(tokens_per_rank, top_k, p, hidden, num_experts) if p > 1 else 0.0
        rows.append({"ep_size": p, "replicas": world // p, "memory_bytes": 16 * held, "gradient_bytes": grads,
                     "all_to_all_bytes": a2a, "step_bytes": grads + a2a})
    return rows
