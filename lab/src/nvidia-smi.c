/*
 * Copyright (c) gpuready.nvidia contributors
 * GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
 *
 * The lab's nvidia-smi stand-in: dynamically linked, dlopens libnvidia-ml.so.1 and prints what
 * NVML answers. `nvidia-smi -L` lists the GPUs; without arguments it prints a short summary.
 * Without the library it fails like the real one (exit 12); when nvmlInit fails it exits with
 * NVML's return code (9 = driver not loaded).
 */
#include <stdio.h>
#include <string.h>

#include "nvml_dl.h"

int main(int argc, char **argv)
{
    struct nvml n;
    char why[512], driver[96] = "N/A", name[96], uuid[96];
    unsigned int count = 0, i;
    int cuda = 0, list = argc > 1 && (!strcmp(argv[1], "-L") || !strcmp(argv[1], "--list-gpus"));
    nvmlReturn_t rc = nvml_load(&n, why, sizeof why);

    if (rc) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: "
               "NVML library not found (%s). Make sure that the latest NVIDIA driver is installed and running.\n",
               why);
        return rc;
    }
    if ((rc = n.init()) != 0) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver (%s). "
               "Make sure that the latest NVIDIA driver is installed and running.\n", n.error_string(rc));
        return rc;
    }
    n.driver_version(driver, sizeof driver);
    n.cuda_version(&cuda);
    n.count(&count);
    if (!list)
        printf("+---------------------------------------------------------------------------------------+\n"
               "| NVIDIA-SMI %-18s Driver Version: %-18s CUDA Version: %d.%-8d|\n"
               "+---------------------------------------------------------------------------------------+\n",
               driver, driver, cuda / 1000, (cuda % 1000) / 10);
    for (i = 0; i < count; i++) {
        nvmlDevice_t dev;
        nvmlMemory_t mem = {0, 0, 0};
        nvmlPciInfo_t pci;
        memset(&pci, 0, sizeof pci);
        if ((rc = n.handle(i, &dev)) != 0) {
            printf("Unable to determine the device handle for GPU %u: %s\n", i, n.error_string(rc));
            continue;
        }
        n.name(dev, name, sizeof name);
        n.uuid(dev, uuid, sizeof uuid);
        if (list) {
            printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
            continue;
        }
        n.memory(dev, &mem);
        n.pci(dev, &pci);
        printf("| %3u  %-32s | %-16s | %8lluMiB / %8lluMiB |\n", i, name, pci.busId,
               mem.used >> 20, mem.total >> 20);
    }
    if (!list)
        printf("+---------------------------------------------------------------------------------------+\n");
    n.shutdown();
    return 0;
}
