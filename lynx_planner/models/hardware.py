"""The hardware catalog. Peaks are datasheet values; efficiencies, bus bandwidths and the interference factor are
assumptions to calibrate once per cluster (a GEMM microbenchmark and nccl-tests `busbw`)."""

from __future__ import annotations

from ..schema import Hardware

GiB = 1 << 30

_ASSUMED = (
    "Efficiencies, bus bandwidths (nccl-tests busbw) and interference are assumptions, not measurements: "
    "calibrate them with a GEMM microbenchmark and nccl-tests on the target cluster."
)


def _hw(name: str, mem_gib: int, tflops: float, hbm_gbs: float, intra_gbs: float, inter_gbs: float, note: str,
        gemm: float = 0.70, attn: float = 0.50, mem: float = 0.80) -> Hardware:
    return Hardware(
        name=name,
        memory_bytes=mem_gib * GiB,
        peak_flops=tflops * 1e12,
        hbm_bytes_per_s=hbm_gbs * 1e9,
        gemm_efficiency=gemm,
        attention_efficiency=attn,
        memory_efficiency=mem,
        gpus_per_node=8,
        intra_node_bus_bytes_per_s=intra_gbs * 1e9,
        intra_node_latency_s=15e-6,
        inter_node_bus_bytes_per_s=inter_gbs * 1e9,
        inter_node_latency_s=20e-6,
        interference=1.15,
        notes=f"{note} {_ASSUMED}",
    )


HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        _hw("v100-32g-nvlink", 32, 125.0, 900.0, 130.0, 12.0,
            "V100 SXM2 32 GB: 125 TFLOP/s fp16, 900 GB/s HBM2; NVLink2 hybrid cube mesh; 100 Gb/s IB per GPU."),
        _hw("a100-40g-nvlink", 40, 312.0, 1555.0, 230.0, 24.0,
            "A100 SXM4 40 GB: 312 TFLOP/s bf16, 1555 GB/s HBM2; NVLink3/NVSwitch; 200 Gb/s HDR IB per GPU."),
        _hw("a100-80g-nvlink", 80, 312.0, 2039.0, 230.0, 24.0,
            "A100 SXM4 80 GB: 312 TFLOP/s bf16, 2039 GB/s HBM2e; NVLink3/NVSwitch; 200 Gb/s HDR IB per GPU."),
        _hw("a100-80g-pcie", 80, 312.0, 1935.0, 20.0, 12.0,
            "A100 PCIe 80 GB: 312 TFLOP/s bf16, 1935 GB/s HBM2e; PCIe 4.0 x16 through host bridges, no NVLink; "
            "100 Gb/s Ethernet/IB per node share."),
        _hw("h100-80g-nvlink", 80, 989.5, 3350.0, 360.0, 45.0,
            "H100 SXM5 80 GB: 989.5 TFLOP/s dense bf16 (1979 with sparsity), 3350 GB/s HBM3; NVLink4/NVSwitch; "
            "400 Gb/s NDR IB per GPU."),
    ]
}
