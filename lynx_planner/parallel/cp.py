"""Context parallelism (Megatron --context-parallel-size, torchtitan context_parallel_degree): the sequence of every
micro-batch is split over cp ranks, so each rank's activations cover seq_len / cp tokens, and attention runs as ring
attention (Megatron's and torchtitan's default): the local queries attend to every K/V chunk of the sequence while
the K/V chunks travel around the CP ring, one hop per step, beside the blockwise attention of the chunk in hand.

Memory: every activation of a layer is of the local tokens (1/cp of the sequence); the fused attention saves only its
local q, k, v, output and logsumexp. Ring attention also holds the chunk being received beside the one in use (two
K/V chunk buffers, transient: alive only inside the attention op, freed before the next op allocates).

Time: the attention of the local queries against the whole sequence is cp times the work of attention over the local
tokens alone (causal: half the tiles either way, with the load-balanced (zig-zag) chunk order both use). The ring
takes cp - 1 exchange steps per attention in forward (each sends this rank's current K/V chunk to the next rank and
receives one from the previous), and in backward as many steps moving the K/V chunk and its partial dK/dV (twice the
bytes). Step i's transfer runs beside step i's blockwise attention (1/cp of the attention's compute): only what a
step's transfer outlasts its block is exposed (streams.py places it on the CP stream, after the attention op).
"""

from __future__ import annotations

from .. import costs

BWD_BYTES_FACTOR = 2  # backward sends the K/V chunk and its partial dK/dV


def attention_scale(cp: int) -> int:
    """Attention work per rank against the same op built for the local tokens only: local queries x all keys."""
    return cp


def exchange_exposed_s(cp: int, kv_bytes: int, fwd_s: float, bwd_s: float, bus: tuple[float, float]
                       ) -> tuple[float, float]:
    """(forward, backward) seconds the ring's K/V exchange outlasts the blockwise attention beside it: cp - 1 steps,
    each a transfer of one K/V chunk (`kv_bytes`; backward with its dK/dV) against 1/cp of the attention's time."""
    if cp == 1:
        return 0.0, 0.0
    steps = cp - 1
    f = steps * max(0.0, costs.p2p_s(kv_bytes, bus) - fwd_s / cp)
    b = steps * max(0.0, costs.p2p_s(BWD_BYTES_FACTOR * kv_bytes, bus) - bwd_s / cp)
    return f, b


def exchange_s(cp: int, kv_bytes: int, bus: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) seconds of the whole ring exchange of one attention (exposed or not): for the trace."""
    if cp == 1:
        return 0.0, 0.0
    return (cp - 1) * costs.p2p_s(kv_bytes, bus), (cp - 1) * costs.p2p_s(BWD_BYTES_FACTOR * kv_bytes, bus)


def torchtitan_settings(cp: int) -> dict[str, int]:
    return {"context_parallel_degree": cp} if cp > 1 else {}


def megatron_flags(cp: int) -> list[str]:
    return [f"--context-parallel-size {cp}"] if cp > 1 else []
