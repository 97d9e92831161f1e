"""The hardware catalog and the memory reserve. Peaks are datasheet values (cited per kind); efficiencies, the compute
curve (costs.py), bus bandwidths and the interference factor are one description per kind of GPU, to calibrate once
per cluster (a GEMM sweep and nccl-tests `busbw`); docs/accuracy.md says where each constant was fitted."""

from __future__ import annotations

from ..schema import Hardware

GiB = 1 << 30

_ASSUMED = (
    "Efficiencies, bus bandwidths (nccl-tests busbw) and interference are assumptions, not measurements: "
    "calibrate them with a GEMM microbenchmark and nccl-tests on the target cluster."
)

# The shape model (costs.py), fitted on one source, Korthikanti et al. 2022 (A100, Tables 4 and 5: the best of a
# grid over GEMM_EFFICIENCY x GEMM_HALF_DIM x GEMM_BACKWARD_EFFICIENCY), and checked on Narayanan et al. 2021 (A100)
# and Megatron-LM's H100 table (benchmarks/published_runs.py; docs/accuracy.md). The same on every NVIDIA kind.
GEMM_EFFICIENCY = 0.90
GEMM_HALF_DIM = 384.0  # an output 2048 x 768 (tokens x columns per rank) runs at 0.90 x 0.84 x 0.67
ATTENTION_HALF_FLOPS = 1e8  # per (batch, head) slice: 2 s^2 d causal FLOPs; s 1024, d 64 runs at 0.57 of the top
GEMM_BACKWARD_EFFICIENCY = 0.85
ATTENTION_EFFICIENCY = 0.50
# The Hopper die (H100, H200: the same GH100 SMs at 700 W) sustains a smaller share of its datasheet peak in training
# than the A100 does of its own: its GEMM and attention tops are the A100-fitted ones times HOPPER_SUSTAINED, fitted
# on the single-stage rows of Megatron-LM's H100 table (the one published H100 source here; its pipeline rows are the
# check): `python benchmarks/published_runs.py --fit`. H100 GEMMs then top out at 0.65 x 989.5 = 641 TFLOP/s.
HOPPER_SUSTAINED = 0.72


def _hw(name: str, mem_gib: float, tflops: float, hbm_gbs: float, intra_gbs: float, inter_gbs: float, note: str,
        gemm: float = GEMM_EFFICIENCY, attn: float = ATTENTION_EFFICIENCY, mem: float = 0.80,
        nics: int | None = 8) -> Hardware:
    return Hardware(
        name=name,
        memory_bytes=int(mem_gib * GiB),
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
        gemm_half_dim=GEMM_HALF_DIM,
        attention_half_flops=ATTENTION_HALF_FLOPS,
        gemm_backward_efficiency=GEMM_BACKWARD_EFFICIENCY,
        nics_per_node=nics,
    )


HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        _hw("v100-32g-nvlink", 32, 125.0, 900.0, 130.0, 12.0,
            "V100 SXM2 32 GB: 125 TFLOP/s fp16, 900 GB/s HBM2; NVLink2 hybrid cube mesh; 100 Gb/s IB per GPU.",
            nics=None),
        _hw("a100-40g-nvlink", 40, 312.0, 1555.0, 230.0, 24.0,
            "A100 SXM4 40 GB: 312 TFLOP/s bf16, 1555 GB/s HBM2; NVLink3/NVSwitch; 200 Gb/s HDR IB per GPU."),
        _hw("a100-80g-nvlink", 80, 312.0, 2039.0, 230.0, 24.0,
            "A100 SXM4 80 GB: 312 TFLOP/s bf16, 2039 GB/s HBM2e; NVLink3/NVSwitch; 200 Gb/s HDR IB per GPU."),
        _hw("a100-80g-pcie", 80, 312.0, 1935.0, 20.0, 12.0,
            "A100 PCIe 80 GB: 312 TFLOP/s bf16, 1935 GB/s HBM2e; PCIe 4.0 x16 through host bridges, no NVLink; "
            "100 Gb/s Ethernet/IB per node share.", nics=None),
        _hw("h100-80g-nvlink", 80, 989.5, 3350.0, 360.0, 45.0,
            "H100 SXM5 80 GB: 989.5 TFLOP/s dense bf16 (1979 with sparsity), 3350 GB/s HBM3; NVLink4/NVSwitch; "
            "400 Gb/s NDR IB per GPU.", gemm=GEMM_EFFICIENCY * HOPPER_SUSTAINED,
            attn=ATTENTION_EFFICIENCY * HOPPER_SUSTAINED),
        _hw("h200-141g-nvlink", 141, 989.5, 4800.0, 360.0, 45.0,
            "H200 SXM 141 GB (NVIDIA H200 datasheet, nvidia.com/en-us/data-center/h200): 989 TFLOP/s dense bf16 "
            "(1979 with sparsity), 4.8 TB/s HBM3e; NVLink4 900 GB/s/NVSwitch as H100; 400 Gb/s NDR IB per GPU.",
            gemm=GEMM_EFFICIENCY * HOPPER_SUSTAINED, attn=ATTENTION_EFFICIENCY * HOPPER_SUSTAINED),
        _hw("b200-180g-nvlink", 180, 2250.0, 8000.0, 720.0, 45.0,
            "B200 in HGX/DGX B200, 180 GB (NVIDIA HGX B200 and DGX B200 datasheets: 36 PFLOP/s fp16/bf16 per "
            "8 GPUs with sparsity, so 2.25 PFLOP/s dense per GPU; 64 TB/s HBM3e per 8 GPUs, so 8 TB/s); NVLink5 "
            "1.8 TB/s per GPU (bus bandwidth assumed twice H100's); 400 Gb/s ConnectX-7 per GPU."),
        _hw("mi300x-192g", 192, 1307.4, 5300.0, 300.0, 45.0,
            "AMD Instinct MI300X 192 GB (AMD MI300X datasheet): 1307.4 TFLOP/s dense bf16 (2614.9 with sparsity), "
            "5.3 TB/s HBM3; Infinity Fabric, 7 links of 128 GB/s per GPU in an 8-GPU full mesh (RCCL bus bandwidth "
            "assumed 300 GB/s); 400 Gb/s per GPU between nodes. GEMM efficiency assumed 0.50 (hipBLASLt reaches "
            "about half of the datasheet peak on large bf16 GEMMs).", gemm=0.50, attn=0.40),
    ]
}

# The memory reserve: device memory no plan may count on. The CUDA/ROCm context, NCCL and cuBLAS workspaces hold a
# fixed part (RESERVE_FIXED_BYTES); the caching allocator's fragmentation grows with what is allocated
# (RESERVE_FRACTION of the device). On 80 GiB this reserves 4.2 GiB: a plan may use 75.8 GiB.
RESERVE_FIXED_BYTES = 1 * GiB
RESERVE_FRACTION = 0.04


def memory_reserve(hw: Hardware) -> int:
    """Bytes of the device held by the allocator, libraries and fragmentation (`memory_reserve_bytes` where the
    hardware sets it, else RESERVE_FIXED_BYTES + RESERVE_FRACTION of the device, at most half the device)."""
    if hw.memory_reserve_bytes is not None:
        return hw.memory_reserve_bytes
    return min(RESERVE_FIXED_BYTES + int(RESERVE_FRACTION * hw.memory_bytes), hw.memory_bytes // 2)


def default_memory_limit(hw: Hardware) -> int:
    """The memory limit of plan, compare and tune when none is given: the device less the reserve."""
    return hw.memory_bytes - memory_reserve(hw)


# The host link of one GPU (activation offload, lynx_planner/offload.py), per catalog name: kept apart from HARDWARE so
# that catalog hardware, and every profile embedding it, keeps its bytes; a hardware file or `lynx hardware calibrate`
# sets the same fields on the Hardware itself, and they win. Bandwidths are measured pinned cudaMemcpyAsync figures per
# direction (copy engine), not the link's datasheet rate; the source is named in each note, and where a direction was
# not measured it says so. Pinned host memory per GPU is half the system's host memory over its GPUs (the rest for the
# data loader, the OS and pageable buffers). Each copy also pays a fixed latency (offload.COPY_LATENCY_S: 6 us,
# DualPath's measured 5-7 us per cudaMemcpyAsync).
class HostLink:
    def __init__(self, kind: str, d2h_gbs: float, h2d_gbs: float, shared_with_nic: bool, pinned_gib: float,
                 note: str, latency_s: float = 6e-6):
        self.kind, self.d2h, self.h2d = kind, d2h_gbs * 1e9, h2d_gbs * 1e9
        self.shared_with_nic, self.pinned_bytes, self.note = shared_with_nic, int(pinned_gib * GiB), note
        self.latency_s = latency_s


# Published measurements, one per generation (docs/offload.md lists them with their sources):
# - PCIe 3.0 x16: CUDA bandwidthTest, pinned, 32 MiB, on a Tesla P100-PCIE-16GB bound to its own socket: H2D 12.15,
#   D2H 12.89 GB/s (mpicbg-scicomp/gearshifft pull request 82, 2017).
# - PCIe 4.0 x16: nvbandwidth host_to_device_memcpy_ce / device_to_host_memcpy_ce on eight Gen4 x16 GPUs of one
#   node (RTX 4090s), medians 26.2 / 26.8 GB/s (NVIDIA/nvbandwidth issue 15, 2024); BaM (Qureshi et al., ASPLOS
#   2023) measured 25 GB/s peak on an A100's Gen4 x16 (ZaidQureshi/bam issue 54). The card differs, the link does not.
# - PCIe 5.0 x16: nvbandwidth host_to_device_memcpy_ce 55.6 GB/s on an H100 (the example in the NVbandwidth tutorial
#   after NVIDIA's technical blog 'Understanding NVbandwidth', 2025); device-to-host not published there: taken equal.
# Not measured here: `lynx hardware calibrate` on the target machine replaces them.
_GEN3 = "PCIe 3.0 x16: bandwidthTest pinned on a P100, H2D 12.15 / D2H 12.89 GB/s (measured, gearshifft PR 82)."
_GEN4 = "PCIe 4.0 x16: nvbandwidth CE, H2D 26.2 / D2H 26.8 GB/s (measured on Gen4 x16 GPUs, nvbandwidth issue 15)."
_GEN5 = "PCIe 5.0 x16: nvbandwidth host_to_device_memcpy_ce 55.6 GB/s on H100 (device-to-host estimated equal)."
_SWITCH = " The GPU and its NIC share one PCIe switch port (HGX/DGX): GPUDirect RDMA traffic crosses the same x16 link."

_G3, _G4 = (12.89, 12.15), (26.8, 26.2)  # (D2H, H2D) GB/s
HOST_LINKS: dict[str, HostLink] = {
    "v100-32g-nvlink": HostLink("pcie3-x16", *_G3, True, 32, _GEN3 + _SWITCH + " DGX-1: 512 GB host / 8 GPUs."),
    "a100-40g-nvlink": HostLink("pcie4-x16", *_G4, True, 64, _GEN4 + _SWITCH + " DGX A100: 1 TB host / 8 GPUs."),
    "a100-80g-nvlink": HostLink("pcie4-x16", *_G4, True, 128, _GEN4 + _SWITCH + " DGX A100 80G: 2 TB / 8 GPUs."),
    "a100-80g-pcie": HostLink("pcie4-x16", *_G4, False, 64, _GEN4 + " The node's NIC has its own slot."),
    "h100-80g-nvlink": HostLink("pcie5-x16", 55.6, 55.6, True, 128, _GEN5 + _SWITCH + " DGX H100: 2 TB / 8 GPUs."),
    "h200-141g-nvlink": HostLink("pcie5-x16", 55.6, 55.6, True, 128, _GEN5 + _SWITCH + " DGX H200: 2 TB / 8 GPUs."),
    "b200-180g-nvlink": HostLink("pcie5-x16", 55.6, 55.6, True, 128,
                                 _GEN5 + " (assumed the same on B200's Gen5 x16)." + _SWITCH + " DGX B200: 2 TB / 8."),
    "mi300x-192g": HostLink("pcie5-x16", 55.6, 55.6, True, 96,
                            _GEN5 + " (assumed the same on MI300X's Gen5 x16)." + _SWITCH + " 1.5 TB host / 8 GPUs."),
}
