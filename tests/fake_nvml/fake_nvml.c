/*
 * Copyright (c) gpuready.nvidia contributors
 * GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
 *
 * A fake libnvidia-ml.so.1 for tests. It exports only real NVML symbols with their real C
 * signatures and answers in NVML units (bytes, structs). Configured at each nvmlInitWithFlags
 * from the key=value file named by FAKE_NVML_CONFIG (written by tests/fake_nvml/harness.py):
 *
 *   init_rc=0  driver=535.183.01  nvml=12.535.183.01  cuda=12020  count=N
 *   devI.name= devI.uuid= devI.bus_id= devI.minor= devI.memory=<bytes> devI.cc_major= devI.cc_minor=
 *   devI.mig_current= devI.mig_pending= devI.max_mig=  devI.not_supported=<sym>,<sym>,...
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wextra -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_UNKNOWN 999

#define MAX_DEVICES 16
#define STR 96

typedef struct nvmlDevice_st {
    char name[STR];
    char uuid[STR];
    char bus_id[32];
    unsigned int minor;
    unsigned long long memory;
    int cc_major, cc_minor;
    unsigned int mig_current, mig_pending, max_mig;
    char not_supported[512];
} *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static struct nvmlDevice_st devices[MAX_DEVICES];
static unsigned int device_count;
static char driver_version[STR] = "535.183.01";
static char nvml_version[STR] = "12.535.183.01";
static int cuda_version = 12020;
static int initialized;

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

static void set_device_key(struct nvmlDevice_st *d, const char *key, const char *value)
{
    if (!strcmp(key, "name")) copy_str(d->name, sizeof d->name, value);
    else if (!strcmp(key, "uuid")) copy_str(d->uuid, sizeof d->uuid, value);
    else if (!strcmp(key, "bus_id")) copy_str(d->bus_id, sizeof d->bus_id, value);
    else if (!strcmp(key, "minor")) d->minor = (unsigned int)strtoul(value, NULL, 10);
    else if (!strcmp(key, "memory")) d->memory = strtoull(value, NULL, 10);
    else if (!strcmp(key, "cc_major")) d->cc_major = atoi(value);
    else if (!strcmp(key, "cc_minor")) d->cc_minor = atoi(value);
    else if (!strcmp(key, "mig_current")) d->mig_current = (unsigned int)strtoul(value, NULL, 10);
    else if (!strcmp(key, "mig_pending")) d->mig_pending = (unsigned int)strtoul(value, NULL, 10);
    else if (!strcmp(key, "max_mig")) d->max_mig = (unsigned int)strtoul(value, NULL, 10);
    else if (!strcmp(key, "not_supported")) copy_str(d->not_supported, sizeof d->not_supported, value);
}

/* Returns the init return code the configuration asks for. */
static nvmlReturn_t load_config(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    char line[1024];
    nvmlReturn_t init_rc = NVML_SUCCESS;
    FILE *f;

    memset(devices, 0, sizeof devices);
    device_count = 0;
    if (!path || !(f = fopen(path, "r")))
        return NVML_ERROR_UNKNOWN;
    while (fgets(line, sizeof line, f)) {
        char *eq = strchr(line, '=');
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (!eq) continue;
        *eq = '\0';
        const char *key = line, *value = eq + 1;
        if (!strcmp(key, "init_rc")) init_rc = atoi(value);
        else if (!strcmp(key, "driver")) copy_str(driver_version, sizeof driver_version, value);
        else if (!strcmp(key, "nvml")) copy_str(nvml_version, sizeof nvml_version, value);
        else if (!strcmp(key, "cuda")) cuda_version = atoi(value);
        else if (!strcmp(key, "count")) {
            device_count = (unsigned int)strtoul(value, NULL, 10);
            if (device_count > MAX_DEVICES) device_count = MAX_DEVICES;
        } else if (!strncmp(key, "dev", 3)) {
            char *dot;
            unsigned long i = strtoul(key + 3, &dot, 10);
            if (*dot == '.' && i < MAX_DEVICES) set_device_key(&devices[i], dot + 1, value);
        }
    }
    fclose(f);
    return init_rc;
}

static int valid(nvmlDevice_t d)
{
    return d >= devices && d < devices + device_count;
}

/* NOT_SUPPORTED when the device's not_supported list names the symbol. */
static int unsupported(nvmlDevice_t d, const char *symbol)
{
    size_t n = strlen(symbol);
    const char *p = d->not_supported;
    while ((p = strstr(p, symbol)) != NULL) {
        if ((p == d->not_supported || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
        p += n;
    }
    return 0;
}

#define CHECK_DEVICE(d, symbol)                                   \
    do {                                                          \
        if (!initialized) return NVML_ERROR_UNINITIALIZED;        \
        if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;        \
        if (unsupported(d, symbol)) return NVML_ERROR_NOT_SUPPORTED; \
    } while (0)

static nvmlReturn_t copy_out(char *buf, unsigned int length, const char *value)
{
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t rc;
    (void)flags;
    rc = load_config();
    initialized = (rc == NVML_SUCCESS);
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, length, driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, length, nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= device_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    CHECK_DEVICE(device, "nvmlDeviceGetName");
    return copy_out(name, length, device->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    CHECK_DEVICE(device, "nvmlDeviceGetUUID");
    return copy_out(uuid, length, device->uuid);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMinorNumber");
    if (!minorNumber) return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = device->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    CHECK_DEVICE(device, "nvmlDeviceGetPciInfo_v3");
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    sscanf(device->bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x1bb310de;
    copy_str(pci->busId, sizeof pci->busId, device->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xffff, bus, dev, fn);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMemoryInfo");
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->memory;
    memory->used = 0;
    memory->free = device->memory;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    CHECK_DEVICE(device, "nvmlDeviceGetCudaComputeCapability");
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMigMode");
    if (!currentMode || !pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = device->mig_current;
    *pendingMode = device->mig_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMaxMigDeviceCount");
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device->max_mig;
    return NVML_SUCCESS;
}

/* The fake has no MIG instances: every slot is empty, as on a MIG GPU without instances. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMigDeviceHandleByIndex");
    if (!migDevice || index >= device->max_mig) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_FOUND;
}
