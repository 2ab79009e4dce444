/* Internal header of the simulated libnvidia-ml (docs/simulated-libnvml.md). Not NVIDIA's nvml.h: only the return
 * codes and the forwarding entry point the library's own files share. The exported functions keep the C ABI of
 * nvml.h (every parameter is a pointer, an unsigned int, an int, an unsigned long long or an enum, each passed as
 * nvml.h passes it), which is all a caller binding to the symbols needs. */
#ifndef SIMNVML_LIBNVML_H
#define SIMNVML_LIBNVML_H

typedef int nvmlReturn_t; /* an enum in nvml.h: int-sized */

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_EXPORT __attribute__((visibility("default")))

/* Sends one call to the simulator's server and writes its answer into the caller's buffers. `fmt` describes the C
 * parameters in order, separated by spaces; the variadic arguments are those parameters:
 *   h      a handle (device, GPU instance, compute instance, event set): sent as its address
 *   u i U  unsigned int, int (or an enum), unsigned long long
 *   s      const char *, NUL-terminated (NULL allowed: the server decides)
 *   B<n>   const pointer to an n-byte struct (e.g. B8, a placement)
 *   o<n>   pointer to an n-byte output the server fills (o4: unsigned int, o8: a handle, o68: nvmlPciInfo_t)
 *   v      pointer to a versioned output struct: its first unsigned int is NVML_STRUCT_VERSION (size | ver << 24)
 *   S      two parameters: char *buffer, unsigned int length (a string output)
 *   A<n>   two parameters: pointer to an array of n-byte elements, unsigned int *count (NVML's array convention)
 * Returns NVML_ERROR_UNINITIALIZED before nvmlInit, the server's return code otherwise. */
nvmlReturn_t simnvml_forward(const char *name, const char *fmt, ...);

/* What a function the simulator does not model (`name`) returns; it is noted in $DRA_DRIVER_LIBNVML_STUB_LOG, a line
 * per call, where that names a file (which unmodelled functions a program calls). */
nvmlReturn_t simnvml_unsupported(const char *name);

#endif
