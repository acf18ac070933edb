"""The dense peak FLOP/s of each GPU per dtype, keyed by the name NVML reports.

MFU (model FLOPs utilisation) is the model's achieved FLOP/s over the device's peak for the
dtype its FLOPs ran in (:mod:`.mfu`). The peaks are NVIDIA's datasheet figures, **dense**: the
datasheets print the tensor-core figures "with sparsity" (2:4 structured sparsity, which dense
training never uses), marked with an asterisk; those are halved here, and each figure's source is
beside it. A matmul's FLOPs are counted from the operations that ran, so the figure that applies
is the one of the unit that runs a matmul of that dtype:

* ``bf16``, ``fp16``, ``fp8``, ``int8``: the tensor cores (FP16/BF16 with FP32 accumulate, what
  PyTorch's matmuls use; on GeForce cards that is half the FP16-accumulate figure);
* ``tf32``: the tensor cores' TF32 path (an fp32 matmul while TF32 is allowed);
* ``fp32``: the CUDA cores (an fp32 matmul with TF32 off);
* ``fp64``: the FP64 tensor cores where the card has them (cuBLAS's DGEMM runs there), else the
  CUDA cores.

A dtype a card has no figure for (bf16 on a V100 or a T4, TF32 before Ampere, fp8 before Hopper
and Ada) has no peak: :func:`peak_flops` says None, and an MFU of FLOPs in it is not given.

Names: NVML's ``nvmlDeviceGetName``, e.g. ``NVIDIA H100 80GB HBM3`` (the H100 SXM5, as
recorded in ``tests/data/h100_live``), ``NVIDIA H100 PCIe``, ``NVIDIA H100 NVL``, ``NVIDIA
H200`` (recorded in ``tests/data/idle_allocated_gpu``), ``NVIDIA A100-SXM4-80GB``, ``NVIDIA
A100-PCIE-40GB``, ``NVIDIA A100 80GB PCIe``, ``NVIDIA L40S``, ``NVIDIA L4``, ``NVIDIA A10G``,
``NVIDIA A10``, ``Tesla V100-SXM2-32GB``, ``Tesla T4``, ``NVIDIA GeForce RTX 4090``, ``NVIDIA
RTX A6000``, ``NVIDIA RTX 6000 Ada Generation``. Matched case-insensitively by the patterns of
:data:`DEVICE_PEAKS`, the first that matches; a card no pattern matches is unknown (None).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

T = 1e12  # one teraFLOP/s

# The dtype classes a peak may be given for (``FlopCount.by_dtype``'s keys but "other", which
# has no peak anywhere).
PEAK_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8", "int8")


@dataclass(frozen=True)
class DevicePeaks:
    """One card: the pattern its NVML name matches, the name the report uses, its dense peaks."""

    pattern: str
    card: str
    peaks: Mapping[str, float]


# Hopper. Source: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100,
# "Technical Specifications", H100 SXM / H100 NVL columns; tensor figures "with sparsity",
# halved) and the H100 whitepaper (PCIe: "NVIDIA H100 Tensor Core GPU Architecture", table 3).
_H100_SXM = {
    "fp64": 67 * T,  # FP64 Tensor Core 67 TFLOPS
    "fp32": 67 * T,  # FP32 67 TFLOPS
    "tf32": 494.7 * T,  # TF32 Tensor Core 989 TFLOPS* (sparse) -> 494.7 dense (whitepaper)
    "bf16": 989.4 * T,  # BFLOAT16 Tensor Core 1,979 TFLOPS* -> 989.4
    "fp16": 989.4 * T,  # FP16 Tensor Core 1,979 TFLOPS* -> 989.4
    "fp8": 1978.9 * T,  # FP8 Tensor Core 3,958 TFLOPS* -> 1,978.9
    "int8": 1978.9 * T,  # INT8 Tensor Core 3,958 TOPS* -> 1,978.9
}
_H100_PCIE = {
    "fp64": 51 * T,  # FP64 Tensor Core 51 TFLOPS
    "fp32": 51 * T,  # FP32 51 TFLOPS
    "tf32": 378 * T,  # TF32 Tensor Core 756 TFLOPS* -> 378
    "bf16": 756 * T,  # BFLOAT16 Tensor Core 1,513 TFLOPS* -> 756
    "fp16": 756 * T,  # FP16 Tensor Core 1,513 TFLOPS* -> 756
    "fp8": 1513 * T,  # FP8 Tensor Core 3,026 TFLOPS* -> 1,513
    "int8": 1513 * T,  # INT8 Tensor Core 3,026 TOPS* -> 1,513
}
_H100_NVL = {  # per GPU (the datasheet's current NVL column; an older one gave the pair's sum)
    "fp64": 60 * T,  # FP64 Tensor Core 60 TFLOPS
    "fp32": 60 * T,  # FP32 60 TFLOPS
    "tf32": 417.5 * T,  # TF32 Tensor Core 835 TFLOPS* -> 417.5
    "bf16": 835.5 * T,  # BFLOAT16 Tensor Core 1,671 TFLOPS* -> 835.5
    "fp16": 835.5 * T,  # FP16 Tensor Core 1,671 TFLOPS* -> 835.5
    "fp8": 1670.5 * T,  # FP8 Tensor Core 3,341 TFLOPS* -> 1,670.5
    "int8": 1670.5 * T,  # INT8 Tensor Core 3,341 TOPS* -> 1,670.5
}
# Source: NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200, H200 SXM and
# H200 NVL columns): the same compute as H100 SXM / H100 NVL, with more and faster memory.
_H200_SXM = dict(_H100_SXM)  # FP64 TC 67, FP32 67, TF32 989*, BF16/FP16 1,979*, FP8/INT8 3,958*
_H200_NVL = dict(_H100_NVL)  # FP64 TC 60, FP32 60, TF32 835*, BF16/FP16 1,671*, FP8/INT8 3,341*

# Ampere, data centre. Source: NVIDIA A100 Tensor Core GPU datasheet
# (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): 40 GB and 80 GB, SXM and PCIe, have the
# same peaks (the PCIe cards' lower power limit shows in sustained clocks, not in the datasheet).
_A100 = {
    "fp64": 19.5 * T,  # FP64 Tensor Core 19.5 TFLOPS
    "fp32": 19.5 * T,  # FP32 19.5 TFLOPS
    "tf32": 156 * T,  # TF32 Tensor Core 156 TFLOPS (312* sparse)
    "bf16": 312 * T,  # BFLOAT16 Tensor Core 312 TFLOPS (624*)
    "fp16": 312 * T,  # FP16 Tensor Core 312 TFLOPS (624*)
    "int8": 624 * T,  # INT8 Tensor Core 624 TOPS (1,248*)
}
# Source: NVIDIA A10 Tensor Core GPU datasheet (a10-datasheet.pdf).
_A10 = {
    "fp32": 31.2 * T,  # FP32 31.2 TFLOPS
    "tf32": 62.5 * T,  # TF32 Tensor Core 62.5 TFLOPS (125* sparse)
    "bf16": 125 * T,  # BFLOAT16 Tensor Core 125 TFLOPS (250*)
    "fp16": 125 * T,  # FP16 Tensor Core 125 TFLOPS (250*)
    "int8": 250 * T,  # INT8 Tensor Core 250 TOPS (500*)
}
# The A10G (AWS EC2 G5) has no datasheet of NVIDIA's own: the A10's figures stand in, as in
# Lightning's throughput table (lightning/fabric/utilities/throughput.py); the same GA102 chip.
_A10G = dict(_A10)

# Ada, data centre. Source: NVIDIA L40S datasheet (nvidia-l40s-datasheet).
_L40S = {
    "fp32": 91.6 * T,  # FP32 91.6 TFLOPS
    "tf32": 183 * T,  # TF32 Tensor Core 183 | 366* TFLOPS
    "bf16": 362.05 * T,  # BFLOAT16 Tensor Core 362.05 | 733* TFLOPS
    "fp16": 362.05 * T,  # FP16 Tensor Core 362.05 | 733* TFLOPS
    "fp8": 733 * T,  # FP8 Tensor Core 733 | 1,466* TFLOPS
    "int8": 733 * T,  # INT8 Tensor Core 733 | 1,466* TOPS
}
# Source: NVIDIA L4 Tensor Core GPU datasheet (nvidia-l4-datasheet).
_L4 = {
    "fp32": 30.3 * T,  # FP32 30.3 TFLOPS
    "tf32": 60 * T,  # TF32 Tensor Core 120* TFLOPS -> 60
    "bf16": 121 * T,  # BFLOAT16 Tensor Core 242* TFLOPS -> 121
    "fp16": 121 * T,  # FP16 Tensor Core 242* TFLOPS -> 121
    "fp8": 242.5 * T,  # FP8 Tensor Core 485* TFLOPS -> 242.5
    "int8": 242.5 * T,  # INT8 Tensor Core 485* TOPS -> 242.5
}

# Volta. Source: NVIDIA V100 Tensor Core GPU datasheet
# (volta-v100-datasheet-update-us-1165301-r5.pdf): tensor cores run FP16 only (no BF16, no TF32).
_V100_SXM2 = {
    "fp64": 7.8 * T,  # Double-Precision 7.8 TFLOPS
    "fp32": 15.7 * T,  # Single-Precision 15.7 TFLOPS
    "fp16": 125 * T,  # Tensor Performance 125 TFLOPS
}
_V100_PCIE = {
    "fp64": 7 * T,  # Double-Precision 7 TFLOPS
    "fp32": 14 * T,  # Single-Precision 14 TFLOPS
    "fp16": 112 * T,  # Tensor Performance 112 TFLOPS
}
# Source: NVIDIA V100S datasheet (v100s-datasheet): PCIe only.
_V100S_PCIE = {
    "fp64": 8.2 * T,  # Double-Precision 8.2 TFLOPS
    "fp32": 16.4 * T,  # Single-Precision 16.4 TFLOPS
    "fp16": 130 * T,  # Tensor Performance 130 TFLOPS
}

# Turing. Source: NVIDIA T4 Tensor Core GPU datasheet (t4-tensor-core-datasheet-951643.pdf):
# FP16 tensor cores (mixed precision), no BF16, no TF32.
_T4 = {
    "fp32": 8.1 * T,  # Single-Precision 8.1 TFLOPS
    "fp16": 65 * T,  # Mixed-Precision (FP16/FP32) 65 TFLOPS
    "int8": 130 * T,  # INT8 130 TOPS
}

# Ada, workstation and consumer. Source: NVIDIA Ada GPU Architecture whitepaper v2.1
# (nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf), table 2 (RTX 4090) and appendix (RTX 6000
# Ada): "Peak FP16/BF16 Tensor TFLOPS with FP32 Accumulate" dense | sparse.
_RTX_4090 = {
    "fp32": 82.6 * T,  # Peak FP32 TFLOPS (non-Tensor) 82.6
    "tf32": 82.6 * T,  # Peak TF32 Tensor TFLOPS 82.6 | 165.2
    "bf16": 165.2 * T,  # Peak BF16 Tensor TFLOPS with FP32 Accumulate 165.2 | 330.4
    "fp16": 165.2 * T,  # Peak FP16 Tensor TFLOPS with FP32 Accumulate 165.2 | 330.4
    "fp8": 330.3 * T,  # Peak FP8 Tensor TFLOPS with FP32 Accumulate 330.3 | 660.6
    "int8": 660.6 * T,  # Peak INT8 Tensor TOPS 660.6 | 1,321.2
}
_RTX_6000_ADA = {
    "fp32": 91.1 * T,  # Peak FP32 TFLOPS (non-Tensor) 91.1
    "tf32": 182.1 * T,  # Peak TF32 Tensor TFLOPS 182.1 | 364.2
    "bf16": 364.2 * T,  # Peak BF16 Tensor TFLOPS with FP32 Accumulate 364.2 | 728.5
    "fp16": 364.2 * T,  # Peak FP16 Tensor TFLOPS with FP32 Accumulate 364.2 | 728.5
    "fp8": 728.5 * T,  # Peak FP8 Tensor TFLOPS with FP32 Accumulate 728.5 | 1,457
    "int8": 728.5 * T,  # Peak INT8 Tensor TOPS 728.5 | 1,457
}

# Ampere, workstation and consumer. Source: NVIDIA Ampere GA102 GPU Architecture whitepaper v2
# (nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf), table 9 (RTX 3090) and table 10
# (RTX A6000): dense | sparse.
_RTX_3090 = {
    "fp32": 35.6 * T,  # Peak FP32 TFLOPS (non-Tensor) 35.6
    "tf32": 35.6 * T,  # Peak TF32 Tensor TFLOPS 35.6 | 71
    "bf16": 71 * T,  # Peak BF16 Tensor TFLOPS with FP32 Accumulate 71 | 142
    "fp16": 71 * T,  # Peak FP16 Tensor TFLOPS with FP32 Accumulate 71 | 142
    "int8": 284 * T,  # Peak INT8 Tensor TOPS 284 | 568
}
_RTX_A6000 = {
    "fp32": 38.7 * T,  # Peak FP32 TFLOPS (non-Tensor) 38.7
    "tf32": 77.4 * T,  # Peak TF32 Tensor TFLOPS 77.4 | 154.8
    "bf16": 154.8 * T,  # Peak BF16 Tensor TFLOPS with FP32 Accumulate 154.8 | 309.7
    "fp16": 154.8 * T,  # Peak FP16 Tensor TFLOPS with FP32 Accumulate 154.8 | 309.7
    "int8": 309.7 * T,  # Peak INT8 Tensor TOPS 309.7 | 619.4
}

# Most specific first: the first pattern that matches the NVML name wins.
DEVICE_PEAKS: tuple[DevicePeaks, ...] = (
    DevicePeaks(r"\bh100\b.*\bnvl\b", "H100 NVL", _H100_NVL),
    DevicePeaks(r"\bh100\b.*\bpcie\b", "H100 PCIe", _H100_PCIE),
    DevicePeaks(r"\bh100\b.*(\bsxm|\bhbm3\b)", "H100 SXM", _H100_SXM),
    DevicePeaks(r"\bh200\b.*\bnvl\b", "H200 NVL", _H200_NVL),
    DevicePeaks(r"\bh200\b", "H200 SXM", _H200_SXM),
    DevicePeaks(r"\ba100\b.*\bsxm4?\b.*\b40\s*gb\b", "A100 40GB SXM", _A100),
    DevicePeaks(r"\ba100\b.*\bsxm4?\b.*\b80\s*gb\b", "A100 80GB SXM", _A100),
    DevicePeaks(r"\ba100\b.*\b40\s*gb\b", "A100 40GB PCIe", _A100),
    DevicePeaks(r"\ba100\b.*\b80\s*gb\b", "A100 80GB PCIe", _A100),
    DevicePeaks(r"\bl40s\b", "L40S", _L40S),
    DevicePeaks(r"\bl4\b", "L4", _L4),
    DevicePeaks(r"\ba10g\b", "A10G", _A10G),
    DevicePeaks(r"\ba10\b", "A10", _A10),
    DevicePeaks(r"\bv100s\b", "V100S PCIe", _V100S_PCIE),
    DevicePeaks(r"\bv100\b.*\bsxm", "V100 SXM2", _V100_SXM2),
    DevicePeaks(r"\bv100\b", "V100 PCIe", _V100_PCIE),
    DevicePeaks(r"\bt4\b", "T4", _T4),
    DevicePeaks(r"\brtx 4090\b", "RTX 4090", _RTX_4090),
    DevicePeaks(r"\brtx 3090\b(?! ti)", "RTX 3090", _RTX_3090),
    DevicePeaks(r"\brtx a6000\b", "RTX A6000", _RTX_A6000),
    DevicePeaks(r"\brtx 6000 ada\b", "RTX 6000 Ada", _RTX_6000_ADA),
)


@lru_cache(maxsize=256)
def device_peaks(device_name: str | None) -> DevicePeaks | None:
    """The table's entry for an NVML device name; None for a name no pattern matches (or
    none)."""
    if not device_name:
        return None
    name = " ".join(device_name.lower().replace("-", " ").split())
    for entry in DEVICE_PEAKS:
        if re.search(entry.pattern, name):
            return entry
    return None


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """The dense peak FLOP/s of ``device_name`` (NVML's name) for ``dtype`` (one of
    :data:`PEAK_DTYPES`); None where the card is unknown or has no figure for the dtype."""
    entry = device_peaks(device_name)
    if entry is None:
        return None
    return entry.peaks.get(dtype)
