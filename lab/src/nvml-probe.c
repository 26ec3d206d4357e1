/*
 * Copyright (c) gpuready.nvidia contributors
 * GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
 *
 * What a CUDA application does first, in the lab's workload image (/usr/local/bin/nvml-probe):
 * dlopen libnvidia-ml.so.1, nvmlInit, list the GPUs and their MIG devices. Prints "NVML library not found" and exits 12
 * when the container has no driver library, as in a container started without the nvidia runtime.
 */
#include <stdio.h>

#include "nvml_dl.h"

int main(void)
{
    struct nvml n;
    char why[512], name[96], uuid[96];
    unsigned int count = 0, i;
    nvmlReturn_t rc = nvml_load(&n, why, sizeof why);

    if (rc == NVML_ERROR_LIBRARY_NOT_FOUND) {
        printf("NVML library not found: %s\n", why);
        return rc;
    }
    if (rc) {
        printf("NVML unusable: %s\n", why);
        return rc;
    }
    if ((rc = n.init()) != 0) {
        printf("nvmlInit failed: %s (%d)\n", n.error_string(rc), rc);
        return rc;
    }
    n.count(&count);
    for (i = 0; i < count; i++) {
        nvmlDevice_t dev, mig;
        unsigned int max_mig = 0, slot;
        if (n.handle(i, &dev) == 0 && n.name(dev, name, sizeof name) == 0 && n.uuid(dev, uuid, sizeof uuid) == 0)
            printf("probe: GPU %u %s %s\n", i, name, uuid);
        /* the MIG devices this container may see (an empty slot or one out of sight answers NOT_FOUND) */
        if (n.max_mig(dev, &max_mig) != 0) continue;
        for (slot = 0; slot < max_mig; slot++)
            if (n.mig_handle(dev, slot, &mig) == 0 && n.uuid(mig, uuid, sizeof uuid) == 0)
                printf("probe: GPU %u MIG device %u %s\n", i, slot, uuid);
    }
    printf("probe: %u GPU(s) visible\n", count);
    n.shutdown();
    return 0;
}
