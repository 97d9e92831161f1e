"""`lynx hardware calibrate`: measure this machine's device and links and describe them as a Hardware file.

Compute (on the GPU when one is present, else the CPU with `threads` threads, as one pipeline rank would run):
GEMM times over a sweep of shapes, fitted by the shape model of costs.py (peak_flops: the top speed, so
gemm_efficiency is 1; gemm_half_dim), the backward GEMMs (dgrad and wgrad) against that model
(gemm_backward_efficiency), fused attention throughput relative to the top speed, and memory bandwidth (a large copy, read + write: hbm_bytes_per_s, memory_efficiency 1). Links, between
two local processes over the default backend (NCCL on GPUs, else gloo): point-to-point bandwidth and latency
(ping-pong), all-reduce bus bandwidth and latency (nccl-tests' busbw = algbw * 2(n-1)/n), and the interference factor:
how much slower a GEMM loop runs while an all-reduce is in flight beside it. Figures are medians of repeated runs.
Nothing spans nodes here, so the inter-node link is set to the intra-node one (edit it for a cluster).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from .schema import Hardware


def _median_time(fn, repeats: int, sync=lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# GEMM shapes of the shape sweep (m, k, n): square and skinny, as transformer layers have them (CPU: small enough to
# take about a second in all; GPU: layer-sized).
_SHAPES_CPU = [(n, n, n) for n in (128, 256, 512, 1024)] + [(1024, 64, 1024), (1024, 1024, 64), (64, 1024, 1024),
                                                             (2048, 256, 1024), (2048, 1024, 256)]
_SHAPES_GPU = [(n, n, n) for n in (512, 1024, 2048, 4096, 8192)] + [(8192, 128, 8192), (8192, 8192, 128),
                                                                   (16384, 768, 6144), (16384, 6144, 2304)]
_HALF_DIMS = (0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)  # 0: no loss by shape


def fit_shape_model(times: dict[tuple[int, int, int], float]) -> tuple[float, float]:
    """(top FLOP/s, gemm_half_dim) of the shape model (costs.py) that best explains measured GEMM times: for each
    candidate half-dimension, the top speed is the median of achieved / q(m) q(k) q(n); the candidate with the
    smallest median relative error wins."""
    best = None
    for d in _HALF_DIMS:
        q = {s: (s[0] / (s[0] + d)) * (s[1] / (s[1] + d)) * (s[2] / (s[2] + d)) for s in times}
        top = statistics.median(2.0 * m * k * n / t / q[(m, k, n)] for (m, k, n), t in times.items())
        err = statistics.median(abs(2.0 * m * k * n / (top * q[(m, k, n)]) / t - 1) for (m, k, n), t in times.items())
        if best is None or err < best[0]:
            best = (err, top, d)
    return best[1], best[2]


def _compute(device: str, repeats: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    times = {}
    for m, k, n in _SHAPES_CPU if device == "cpu" else _SHAPES_GPU:
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        times[(m, k, n)] = _median_time(lambda a=a, b=b: a @ b, repeats, sync)
    top, half_dim = fit_shape_model(times)
    # backward of [m, k] @ [k, n]: dgrad g @ b^T and wgrad a^T @ g (the shape model gives them the forward's time),
    # against two forwards, timed alternately so that load on the machine hits both alike
    m, k, n = (1024, 1024, 1024) if device == "cpu" else (8192, 4096, 4096)
    a, b, g = (torch.randn(*s, device=device, dtype=dtype) for s in ((m, k), (k, n), (m, n)))
    ratios = [_median_time(lambda: (g @ b.t(), a.t() @ g), 3, sync) / _median_time(lambda: (a @ b, a @ b), 3, sync)
              for _ in range(repeats)]
    batch, heads, seq, dim = (2, 8, 512, 64) if device == "cpu" else (8, 32, 2048, 128)
    q, k, v = (torch.randn(batch, heads, seq, dim, device=device, dtype=dtype) for _ in range(3))
    attn_s = _median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats, sync)
    attn_flops = 4 * batch * heads * seq * seq * dim / 2  # causal: half the score matrix
    nbytes = (64 << 20) if device == "cpu" else (1 << 30)
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    copy_s = _median_time(lambda: dst.copy_(src), repeats, sync)
    return {"gemm_flops": top, "gemm_half_dim": half_dim,
            "gemm_backward_efficiency": min(1.0, 1 / statistics.median(ratios)),
            "attention_efficiency": min(1.0, attn_flops / attn_s / top), "memory_bytes_per_s": 2 * nbytes / copy_s}


def ping_pong(rank: int, nbytes: int, device: str, repeats: int, peer: int | None = None) -> float:
    """One-way seconds of a send of `nbytes` between this rank and `peer` (ranks 0 and 1 by default): the median of
    `repeats` round trips, halved. Every rank of the group calls it (one barrier)."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    peer = 1 - rank if peer is None else peer
    buf = torch.zeros(max(1, nbytes // 4), device=device)

    def once():
        if rank < peer:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
    dist.barrier()
    return _median_time(once, repeats, sync) / 2


def _links(rank: int, world: int, port: int, device: str, threads: int, repeats: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    small, large = 4, 16 << 20  # bytes

    def ping_pong_(nbytes: int) -> float:
        return ping_pong(rank, nbytes, device, repeats)

    def all_reduce(nbytes: int) -> float:
        buf = torch.zeros(max(1, nbytes // 4), device=device)
        dist.barrier()
        return _median_time(lambda: dist.all_reduce(buf), repeats, sync)

    p2p_lat = ping_pong_(small)
    p2p_bw = large / max(ping_pong_(large) - p2p_lat, 1e-9)
    ar_lat = all_reduce(small)
    factor = 2 * (world - 1) / world
    ar_bus = factor * large / max(all_reduce(large) - ar_lat, 1e-9)
    # interference: a GEMM loop alone, then with an all-reduce of a large message in flight beside it
    n = 512 if device == "cpu" else 4096
    a = torch.randn(n, n, device=device)
    buf = torch.zeros(large // 4, device=device)

    def gemms():
        for _ in range(4):
            a @ a

    alone, beside = [], []
    for _ in range(repeats):
        dist.barrier()
        alone.append(_median_time(gemms, 1, sync))
        dist.barrier()
        work = dist.all_reduce(buf, async_op=True)
        t0 = time.perf_counter()
        gemms()
        sync()
        beside.append(time.perf_counter() - t0)
        work.wait()
    interference = max(1.0, statistics.median(beside) / statistics.median(alone))
    if rank == 0:
        Path(out_dir, "links.json").write_text(json.dumps({
            "backend": backend, "p2p_bytes_per_s": p2p_bw, "p2p_latency_s": p2p_lat,
            "bus_bytes_per_s": ar_bus, "latency_s": ar_lat, "interference": interference}))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def calibrate(name: str = "local", threads: int = 1, repeats: int = 10) -> Hardware:
    """Measure this machine (see the module docstring) and return its Hardware description."""
    import torch
    import torch.multiprocessing as mp

    device = "cuda" if torch.cuda.is_available() else "cpu"
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        compute = _compute(device, repeats)
    finally:
        torch.set_num_threads(old)
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_links, args=(2, _free_port(), device, threads, repeats, out_dir), nprocs=2, join=True)
        links = json.loads(Path(out_dir, "links.json").read_text())
    if device == "cuda":
        memory = torch.cuda.get_device_properties(0).total_memory
        per_node = torch.cuda.device_count()
        what = torch.cuda.get_device_name(0)
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        per_node = os.cpu_count() or 1
        what = f"CPU, {os.cpu_count()} cores, {threads} thread(s) per rank"
    compute = {k: float(f"{v:.4g}") for k, v in compute.items()}  # measured: 4 significant digits
    links = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in links.items()}
    return Hardware(
        name=name, memory_bytes=memory, peak_flops=compute["gemm_flops"], hbm_bytes_per_s=compute["memory_bytes_per_s"],
        gemm_efficiency=1.0, attention_efficiency=compute["attention_efficiency"], memory_efficiency=1.0,
        gemm_half_dim=compute["gemm_half_dim"], gemm_backward_efficiency=compute["gemm_backward_efficiency"],
        gpus_per_node=per_node, intra_node_bus_bytes_per_s=links["bus_bytes_per_s"],
        intra_node_latency_s=links["latency_s"], inter_node_bus_bytes_per_s=links["bus_bytes_per_s"],
        inter_node_latency_s=links["latency_s"], interference=links["interference"],
        notes=f"Measured by `lynx hardware calibrate` on {what}: GEMM and attention throughput, copy bandwidth, "
              f"{links['backend']} point-to-point and all-reduce between 2 local processes, GEMMs beside an "
              "all-reduce. Peaks are achieved values (efficiencies 1); the inter-node link copies the intra-node one.",
        device="gpu" if device == "cuda" else "cpu", backend=links["backend"],
        threads=threads if device == "cpu" else None,
        p2p_bytes_per_s=links["p2p_bytes_per_s"], p2p_latency_s=links["p2p_latency_s"],
        **_host_link(repeats))


def _host_link(repeats: int) -> dict:
    """The host link's fields (offload.py): measured pinned D2H/H2D copies on CUDA; on a CPU, 'none' (a CPU rank's
    activations already live in host memory: there is nothing to offload to)."""
    from .offload import measure_link

    measured = measure_link(repeats)
    if measured is None:
        return {"host_link": "none"}
    import torch

    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # half of it over the GPUs, as the catalog does
    return {"host_link": "measured", "pinned_host_bytes": host // 2 // max(1, torch.cuda.device_count()), **measured}
