"""NVML structs the simulator returns that pynvml (nvidia-ml-py 13.615) does not define, laid out as nvml.h (NVML
13.4) declares them. Their `version` field is NVML_STRUCT_VERSION: the struct's size | version << 24."""

from __future__ import annotations

import ctypes

NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96


def struct_version(struct: type[ctypes.Structure], version: int) -> int:
    return ctypes.sizeof(struct) | (version << 24)


class c_nvmlGpuInstanceProfileInfo_v3_t(ctypes.Structure):
    """v3 drops isP2pSupported and adds capabilities (NVML_GPU_INSTANCE_PROFILE_CAPS_P2P 0x1, _GFX 0x2)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("copyEngineCount", ctypes.c_uint),
        ("decoderCount", ctypes.c_uint),
        ("encoderCount", ctypes.c_uint),
        ("jpegCount", ctypes.c_uint),
        ("ofaCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
        ("name", ctypes.c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
        ("capabilities", ctypes.c_uint),
    ]


class c_nvmlComputeInstanceProfileInfo_v3_t(ctypes.Structure):
    """v3 adds capabilities (NVML_COMPUTE_INSTANCE_PROFILE_CAPS_GFX 0x1)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("name", ctypes.c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
        ("capabilities", ctypes.c_uint),
    ]


nvmlGpuInstanceProfileInfo_v3 = struct_version(c_nvmlGpuInstanceProfileInfo_v3_t, 3)
nvmlComputeInstanceProfileInfo_v3 = struct_version(c_nvmlComputeInstanceProfileInfo_v3_t, 3)
