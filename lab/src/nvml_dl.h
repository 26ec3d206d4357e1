/*
 * Copyright (c) gpuready.nvidia contributors
 * GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
 *
 * The few NVML declarations the lab's nvidia-smi stand-in and NVML probe use. Both load
 * libnvidia-ml.so.1 with dlopen at run time, as CUDA applications and the real nvidia-smi do,
 * so a container without the library bound in gets "library not found", not a link error.
 */
#ifndef LAB_NVML_DL_H
#define LAB_NVML_DL_H

#include <dlfcn.h>
#include <stdio.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13

struct nvml {
    void *lib;
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    const char *(*error_string)(nvmlReturn_t);
    nvmlReturn_t (*driver_version)(char *, unsigned int);
    nvmlReturn_t (*cuda_version)(int *);
    nvmlReturn_t (*count)(unsigned int *);
    nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
    nvmlReturn_t (*max_mig)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*mig_handle)(nvmlDevice_t, unsigned int, nvmlDevice_t *);
};

/* 0, or NVML_ERROR_LIBRARY_NOT_FOUND / NVML_ERROR_FUNCTION_NOT_FOUND with a message in why. */
static int nvml_load(struct nvml *n, char *why, size_t size)
{
    n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!n->lib) {
        snprintf(why, size, "%s", dlerror());
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
#define SYM(field, symbol) \
    if (!(*(void **)&n->field = dlsym(n->lib, symbol))) { \
        snprintf(why, size, "symbol %s not found", symbol); \
        return NVML_ERROR_FUNCTION_NOT_FOUND; \
    }
    SYM(init, "nvmlInit_v2")
    SYM(shutdown, "nvmlShutdown")
    SYM(error_string, "nvmlErrorString")
    SYM(driver_version, "nvmlSystemGetDriverVersion")
    SYM(cuda_version, "nvmlSystemGetCudaDriverVersion")
    SYM(count, "nvmlDeviceGetCount_v2")
    SYM(handle, "nvmlDeviceGetHandleByIndex_v2")
    SYM(name, "nvmlDeviceGetName")
    SYM(uuid, "nvmlDeviceGetUUID")
    SYM(memory, "nvmlDeviceGetMemoryInfo")
    SYM(pci, "nvmlDeviceGetPciInfo_v3")
    SYM(max_mig, "nvmlDeviceGetMaxMigDeviceCount")
    SYM(mig_handle, "nvmlDeviceGetMigDeviceHandleByIndex")
#undef SYM
    return 0;
}

#endif
