/*
 * Copyright (c) gpuready.nvidia contributors
 * GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
 *
 * A fake libnvidia-ml.so.1 for tests. It exports only real NVML symbols with their real C
 * signatures and answers in NVML's units (bytes, NVML structs, NVML return codes). At each
 * nvmlInitWithFlags it reads the JSON file named by FAKE_NVML_CONFIG (schema in README.md next to
 * this file; tests/fake_nvml/harness.py writes it). A missing or malformed file makes init fail
 * with NVML_ERROR_UNKNOWN and a message on stderr, so a broken fixture never looks like a GPU.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wextra -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24))
#define MAX_DEVICES 16
#define MAX_MIG 8
#define STR 96

/* ---- a small JSON reader (objects, arrays, strings, numbers, true/false/null) ---------------- */

enum json_type { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct json {
    enum json_type type;
    double num;
    char *str;          /* J_STR value */
    char *key;          /* member name inside an object */
    struct json *child; /* first element / member */
    struct json *next;
};

static void json_free(struct json *j)
{
    while (j) {
        struct json *next = j->next;
        json_free(j->child);
        free(j->str);
        free(j->key);
        free(j);
        j = next;
    }
}

static const char *skip_ws(const char *p)
{
    while (*p && isspace((unsigned char)*p)) p++;
    return p;
}

static struct json *parse_value(const char **p, int depth);

/* Returns a malloc'd string; *p is left after the closing quote. Non-ASCII \u escapes become '?'. */
static char *parse_string(const char **p)
{
    const char *s = *p + 1;
    size_t cap = strlen(s) + 1, n = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    while (*s && *s != '"') {
        char c = *s++;
        if (c == '\\') {
            c = *s++;
            switch (c) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned int code = 0;
                if (sscanf(s, "%4x", &code) != 1) { free(out); return NULL; }
                s += 4;
                c = code < 0x80 ? (char)code : '?';
                break;
            }
            case '"': case '\\': case '/': break;
            default: free(out); return NULL;
            }
        }
        out[n++] = c;
    }
    if (*s != '"') { free(out); return NULL; }
    out[n] = '\0';
    *p = s + 1;
    return out;
}

static struct json *parse_value(const char **p, int depth)
{
    struct json *j;
    *p = skip_ws(*p);
    if (depth > 32 || !(j = calloc(1, sizeof *j))) return NULL;
    if (**p == '{' || **p == '[') {
        int object = **p == '{';
        struct json **tail = &j->child;
        j->type = object ? J_OBJ : J_ARR;
        *p = skip_ws(*p + 1);
        if (**p == (object ? '}' : ']')) { (*p)++; return j; }
        for (;;) {
            char *key = NULL;
            struct json *item;
            if (object) {
                *p = skip_ws(*p);
                if (**p != '"' || !(key = parse_string(p))) goto fail;
                *p = skip_ws(*p);
                if (**p != ':') { free(key); goto fail; }
                (*p)++;
            }
            if (!(item = parse_value(p, depth + 1))) { free(key); goto fail; }
            item->key = key;
            *tail = item;
            tail = &item->next;
            *p = skip_ws(*p);
            if (**p == ',') { (*p)++; continue; }
            if (**p == (object ? '}' : ']')) { (*p)++; return j; }
            goto fail;
        }
    }
    if (**p == '"') {
        j->type = J_STR;
        if (!(j->str = parse_string(p))) goto fail;
        return j;
    }
    if (!strncmp(*p, "true", 4) || !strncmp(*p, "false", 5)) {
        j->type = J_BOOL;
        j->num = **p == 't';
        *p += j->num ? 4 : 5;
        return j;
    }
    if (!strncmp(*p, "null", 4)) {
        *p += 4;
        return j;
    }
    {
        char *end;
        j->num = strtod(*p, &end);
        if (end == *p) goto fail;
        j->type = J_NUM;
        *p = end;
        return j;
    }
fail:
    json_free(j);
    return NULL;
}

static struct json *member(const struct json *obj, const char *key)
{
    const struct json *m;
    if (!obj || obj->type != J_OBJ) return NULL;
    for (m = obj->child; m; m = m->next)
        if (!strcmp(m->key, key)) return (struct json *)m;
    return NULL;
}

static double num_of(const struct json *obj, const char *key, double fallback)
{
    const struct json *m = member(obj, key);
    return m && (m->type == J_NUM || m->type == J_BOOL) ? m->num : fallback;
}

static void str_of(const struct json *obj, const char *key, char *dst, size_t size)
{
    const struct json *m = member(obj, key);
    snprintf(dst, size, "%s", m && m->type == J_STR ? m->str : "");
}

/* ---- the fake's state ------------------------------------------------------------------------ */

typedef struct nvmlDeviceAttributes_st {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef unsigned char nvmlGpuFabricState_t;

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

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

/* One struct for full GPUs and MIG devices, as NVML hands out one handle type for both. */
typedef struct nvmlDevice_st {
    int in_use;
    struct nvmlDevice_st *parent; /* MIG devices only */
    char name[STR];
    char uuid[STR];
    char bus_id[32];
    unsigned int pci_device_id;
    unsigned int minor;
    unsigned int numa_node;
    unsigned long long memory;
    int cc_major, cc_minor;
    int has_mig_mode;
    unsigned int mig_current, mig_pending, max_mig;
    int has_attributes;
    nvmlDeviceAttributes_t attributes;
    unsigned int gpu_instance_id, gpu_instance_profile_id; /* MIG devices: their GPU instance */
    unsigned int compute_instance_id, compute_instance_profile_id; /* MIG devices: their compute instance */
    int has_fabric;
    nvmlGpuFabricInfo_t fabric;
    char not_supported[512];
} *nvmlDevice_t;

/* A MIG device stands for its GPU instance too (one compute instance per GPU instance). */
typedef struct nvmlDevice_st *nvmlGpuInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

/* ... and for its compute instance: the same struct again. */
typedef struct nvmlDevice_st *nvmlComputeInstance_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

static struct nvmlDevice_st devices[MAX_DEVICES];
static struct nvmlDevice_st migs[MAX_DEVICES][MAX_MIG];
static unsigned int device_count;
static char driver_version[STR];
static char kernel_module[1024];
static char nvml_version[STR];
static int cuda_version;
/* How many nvmlInit calls no nvmlShutdown has matched yet: NVML keeps this reference count and shuts
 * down only when it drops to zero (the device plugin initialises in nested scopes). */
static int initialized;
/* Whether the configuration is the built-in copy, which answers in a container (load_config) */
static int in_container;

static int parse_uuid(const char *text, unsigned char out[16])
{
    int n = 0;
    for (; *text && n < 32; text++) {
        int v;
        if (*text == '-') continue;
        if (!isxdigit((unsigned char)*text)) return -1;
        v = isdigit((unsigned char)*text) ? *text - '0' : (tolower((unsigned char)*text) - 'a' + 10);
        if (n % 2 == 0) out[n / 2] = (unsigned char)(v << 4);
        else out[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32 && !*text ? 0 : -1;
}

static void load_attributes(struct nvmlDevice_st *d, const struct json *a)
{
    if (!a || a->type != J_OBJ) return;
    d->has_attributes = 1;
    d->attributes.multiprocessorCount = (unsigned int)num_of(a, "multiprocessorCount", 0);
    d->attributes.sharedCopyEngineCount = (unsigned int)num_of(a, "sharedCopyEngineCount", 0);
    d->attributes.sharedDecoderCount = (unsigned int)num_of(a, "sharedDecoderCount", 0);
    d->attributes.sharedEncoderCount = (unsigned int)num_of(a, "sharedEncoderCount", 0);
    d->attributes.sharedJpegCount = (unsigned int)num_of(a, "sharedJpegCount", 0);
    d->attributes.sharedOfaCount = (unsigned int)num_of(a, "sharedOfaCount", 0);
    d->attributes.gpuInstanceSliceCount = (unsigned int)num_of(a, "gpuInstanceSliceCount", 0);
    d->attributes.computeInstanceSliceCount = (unsigned int)num_of(a, "computeInstanceSliceCount", 0);
    d->attributes.memorySizeMB = (unsigned long long)num_of(a, "memorySizeMB", 0);
}

static void load_not_supported(struct nvmlDevice_st *d, const struct json *list)
{
    const struct json *item;
    size_t used = 0;
    if (!list || list->type != J_ARR) return;
    for (item = list->child; item; item = item->next)
        if (item->type == J_STR && used + strlen(item->str) + 2 < sizeof d->not_supported)
            used += (size_t)sprintf(d->not_supported + used, "%s,", item->str);
}

/* The nvidia-caps minor the driver lists for a capability (`monitor`, `gpu0/gi1/ci0/access`) in
 * /proc/driver/nvidia-caps/mig-minors, or -1. */
static long mig_cap_minor(const char *capability)
{
    char line[128], name[96];
    long minor, found = -1;
    FILE *f = fopen("/proc/driver/nvidia-caps/mig-minors", "r");

    if (!f) return -1;
    while (found < 0 && fgets(line, sizeof line, f))
        if (sscanf(line, "%95s %ld", name, &minor) == 2 && !strcmp(name, capability)) found = minor;
    fclose(f);
    return found;
}

static int mig_cap_device_exists(const char *capability)
{
    char path[64];
    struct stat node;
    long minor = mig_cap_minor(capability);

    snprintf(path, sizeof path, "/dev/nvidia-caps/nvidia-cap%ld", minor);
    return minor >= 0 && stat(path, &node) == 0 && S_ISCHR(node.st_mode);
}

/* In a container NVML sees a MIG device only with its capability's device node, or with the monitor
 * capability's (which the nvidia runtime gives for NVIDIA_MIG_MONITOR_DEVICES=all). */
static int mig_visible(unsigned int gpu_minor, unsigned int gpu_instance, unsigned int compute_instance)
{
    char capability[64];

    if (!in_container || mig_cap_device_exists("monitor")) return 1;
    snprintf(capability, sizeof capability, "gpu%u/gi%u/ci%u/access", gpu_minor, gpu_instance, compute_instance);
    return mig_cap_device_exists(capability);
}

/* index: the device's place among those enumerated; position: its place in the configuration, the
 * default minor number. */
static int load_device(unsigned int index, unsigned int position, const struct json *cfg)
{
    struct nvmlDevice_st *d = &devices[index];
    const struct json *cc = member(cfg, "compute_capability");
    const struct json *mode = member(cfg, "mig_mode");
    const struct json *fabric = member(cfg, "fabric");
    const struct json *mig;
    unsigned int slot = 0;

    d->in_use = 1;
    str_of(cfg, "name", d->name, sizeof d->name);
    str_of(cfg, "uuid", d->uuid, sizeof d->uuid);
    str_of(cfg, "pci_bus_id", d->bus_id, sizeof d->bus_id);
    d->pci_device_id = (unsigned int)num_of(cfg, "pci_device_id", 0x1bb310de);
    d->minor = (unsigned int)num_of(cfg, "minor_number", position);
    d->numa_node = (unsigned int)num_of(cfg, "numa_node", 0);
    d->memory = (unsigned long long)num_of(cfg, "memory_total", 0);
    if (cc && cc->type == J_ARR && cc->child && cc->child->next) {
        d->cc_major = (int)cc->child->num;
        d->cc_minor = (int)cc->child->next->num;
    }
    /* No mig_mode: the GPU predates MIG and nvmlDeviceGetMigMode answers NOT_SUPPORTED. */
    if (mode && mode->type == J_ARR && mode->child && mode->child->next) {
        d->has_mig_mode = 1;
        d->mig_current = (unsigned int)mode->child->num;
        d->mig_pending = (unsigned int)mode->child->next->num;
    }
    d->max_mig = (unsigned int)num_of(cfg, "max_mig_devices", d->has_mig_mode ? MAX_MIG : 0);
    if (d->max_mig > MAX_MIG) d->max_mig = MAX_MIG;
    if (fabric && fabric->type == J_OBJ) {
        char uuid[64];
        d->has_fabric = 1;
        str_of(fabric, "cluster_uuid", uuid, sizeof uuid);
        if (*uuid && parse_uuid(uuid, d->fabric.clusterUuid)) {
            fprintf(stderr, "fake NVML: device %u: bad fabric cluster_uuid %s\n", index, uuid);
            return -1;
        }
        d->fabric.cliqueId = (unsigned int)num_of(fabric, "clique_id", 0);
        d->fabric.state = (nvmlGpuFabricState_t)num_of(fabric, "state", 3);
        d->fabric.status = (nvmlReturn_t)num_of(fabric, "status", NVML_SUCCESS);
    }
    load_not_supported(d, member(cfg, "not_supported"));
    mig = member(cfg, "mig_devices");
    for (mig = mig && mig->type == J_ARR ? mig->child : NULL; mig; mig = mig->next, slot++) {
        unsigned int at = (unsigned int)num_of(mig, "slot", slot);
        unsigned int gi = (unsigned int)num_of(mig, "gpu_instance_id", at + 1);
        unsigned int ci = (unsigned int)num_of(mig, "compute_instance_id", 0);
        struct nvmlDevice_st *m;
        if (at >= d->max_mig) {
            fprintf(stderr, "fake NVML: device %u: MIG slot %u >= max_mig_devices %u\n", index, at, d->max_mig);
            return -1;
        }
        if (!mig_visible(d->minor, gi, ci)) continue;
        m = &migs[index][at];
        m->in_use = 1;
        m->parent = d;
        str_of(mig, "name", m->name, sizeof m->name);
        str_of(mig, "uuid", m->uuid, sizeof m->uuid);
        m->memory = (unsigned long long)num_of(mig, "memory_total", 0);
        m->gpu_instance_id = gi;
        m->gpu_instance_profile_id = (unsigned int)num_of(mig, "gpu_instance_profile_id", 0);
        m->compute_instance_id = ci;
        m->compute_instance_profile_id = (unsigned int)num_of(mig, "compute_instance_profile_id", 0);
        m->cc_major = d->cc_major;
        m->cc_minor = d->cc_minor;
        load_attributes(m, member(mig, "attributes"));
        load_not_supported(m, member(mig, "not_supported"));
    }
    return 0;
}

/* Built with -DFAKE_NVML_DEFAULT_CONFIG="/etc/nvidia-fake/gpus.json" (the lab's nodes), the fake reads
 * that file when FAKE_NVML_CONFIG is unset, as an installed driver needs no environment. */
#ifdef FAKE_NVML_DEFAULT_CONFIG
#define DEFAULT_CONFIG FAKE_NVML_DEFAULT_CONFIG
#else
#define DEFAULT_CONFIG NULL
#endif

/* Built with -DFAKE_NVML_BUILTIN_CONFIG_HEADER="builtin_config.h" (harness.build(builtin_config=...): a
 * node's own copy of the library), the fake also carries its node's configuration, as
 * `static const char builtin_config[]`. That copy answers where no configuration file is, which is in a
 * container: the nvidia runtime mounts the library alone, and real NVML there reaches the node's driver
 * through the device nodes it was given. So, like real NVML in a container, it enumerates only the GPUs
 * whose /dev/nvidia<minor> exists and the MIG devices mig_visible allows; the kernel module's sysfs folder
 * is the node's, out of reach there, and is not checked. */
#ifdef FAKE_NVML_BUILTIN_CONFIG_HEADER
#include FAKE_NVML_BUILTIN_CONFIG_HEADER
static char *builtin_copy(void) { return strdup(builtin_config); }
#else
static char *builtin_copy(void) { return NULL; }
#endif

/* Real NVML asks the loaded kernel module (the driver's RM) for its version at init and fails when it
 * is not loaded or is another version than the library's, as after a driver upgrade without a reboot.
 * The fake's loaded module is the sysfs folder `kernel_module` names (<sysfs>/module/nvidia): no folder
 * is no module, and a `version` file in it that differs from driver_version is a mismatch. */
static nvmlReturn_t check_kernel_module(void)
{
    char path[sizeof kernel_module + 16], loaded[STR] = "";
    struct stat folder;
    size_t n;
    FILE *f;

    if (stat(kernel_module, &folder) != 0 || !S_ISDIR(folder.st_mode)) return NVML_ERROR_DRIVER_NOT_LOADED;
    snprintf(path, sizeof path, "%s/version", kernel_module);
    if (!(f = fopen(path, "r"))) return NVML_SUCCESS;
    n = fread(loaded, 1, sizeof loaded - 1, f);
    fclose(f);
    while (n > 0 && isspace((unsigned char)loaded[n - 1])) n--;
    loaded[n] = '\0';
    return strcmp(loaded, driver_version) ? NVML_ERROR_LIB_RM_VERSION_MISMATCH : NVML_SUCCESS;
}

/* The whole file at path (NUL-terminated, to free), or NULL. */
static char *read_file(const char *path)
{
    char *text = NULL;
    long size;
    FILE *f = fopen(path, "rb");

    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0
        || !(text = calloc(1, (size_t)size + 1)) || fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

/* Whether the device node of the GPU with this configuration (at this position) exists. */
static int device_node_exists(const struct json *cfg, unsigned int position)
{
    char path[64];
    struct stat node;

    snprintf(path, sizeof path, "/dev/nvidia%u", (unsigned int)num_of(cfg, "minor_number", position));
    return stat(path, &node) == 0 && S_ISCHR(node.st_mode);
}

/* Returns the init return code: the configured one, or UNKNOWN when the configuration is unusable. */
static nvmlReturn_t load_config(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG") ? getenv("FAKE_NVML_CONFIG") : DEFAULT_CONFIG;
    struct json *root = NULL;
    const struct json *list;
    nvmlReturn_t rc = NVML_ERROR_UNKNOWN;
    char *text = path ? read_file(path) : NULL;
    unsigned int position = 0;
    const char *p;

    memset(devices, 0, sizeof devices);
    kernel_module[0] = '\0';
    memset(migs, 0, sizeof migs);
    device_count = 0;
    in_container = 0;
    if (!text && !getenv("FAKE_NVML_CONFIG") && (text = builtin_copy())) {
        path = "the built-in configuration";
        in_container = 1;
    }
    if (!text) {
        fprintf(stderr, "fake NVML: cannot read %s\n", path ? path : "FAKE_NVML_CONFIG (unset)");
        return rc;
    }
    p = text;
    root = parse_value(&p, 0);
    if (root && *skip_ws(p)) { json_free(root); root = NULL; }
    free(text);
    if (!root || root->type != J_OBJ) {
        fprintf(stderr, "fake NVML: %s is not a JSON object\n", path);
        json_free(root);
        return rc;
    }
    str_of(root, "driver_version", driver_version, sizeof driver_version);
    str_of(root, "nvml_version", nvml_version, sizeof nvml_version);
    cuda_version = (int)num_of(root, "cuda_driver_version", 0);
    rc = (nvmlReturn_t)num_of(root, "init_rc", NVML_SUCCESS);
    str_of(root, "kernel_module", kernel_module, sizeof kernel_module);
    if (rc == NVML_SUCCESS && kernel_module[0] && !in_container) rc = check_kernel_module();
    list = member(root, "devices");
    for (list = list && list->type == J_ARR ? list->child : NULL; list; list = list->next, position++) {
        if (in_container && !device_node_exists(list, position)) continue;
        if (device_count == MAX_DEVICES || load_device(device_count, position, list)) {
            fprintf(stderr, "fake NVML: %s: device %u unusable\n", path, position);
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
        device_count++;
    }
    json_free(root);
    return rc;
}

static int valid(nvmlDevice_t d)
{
    const struct nvmlDevice_st *first = &migs[0][0];
    if (d >= devices && d < devices + device_count) return 1;
    return d >= first && d < first + MAX_DEVICES * MAX_MIG && d->in_use;
}

/* NOT_SUPPORTED when the device's not_supported list names the symbol. */
static int unsupported(nvmlDevice_t d, const char *symbol)
{
    size_t n = strlen(symbol);
    const char *p = d->not_supported; /* "sym,sym,...," */
    for (; (p = strstr(p, symbol)) != NULL; p += n)
        if ((p == d->not_supported || p[-1] == ',') && p[n] == ',')
            return 1;
    return 0;
}

#define CHECK_DEVICE(d, symbol)                                      \
    do {                                                             \
        if (!initialized) return NVML_ERROR_UNINITIALIZED;           \
        if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;           \
        if (unsupported(d, symbol)) return NVML_ERROR_NOT_SUPPORTED; \
    } while (0)

static nvmlReturn_t copy_out(char *buf, unsigned int length, const char *value)
{
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

/* ---- the NVML API ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t rc;
    (void)flags;
    if (initialized) {
        initialized++;
        return NVML_SUCCESS;
    }
    rc = load_config();
    if (rc == NVML_SUCCESS) initialized = 1;
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
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
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
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

/* Real NVML answers this one without nvmlInit (it asks the CUDA driver library). */
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

/* GPUs and, on MIG-enabled GPUs, their MIG devices, as NVML looks both up by UUID. */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    unsigned int i, slot;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < device_count; i++) {
        if (strcmp(devices[i].uuid, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
        for (slot = 0; slot < MAX_MIG; slot++) {
            if (migs[i][slot].in_use && strcmp(migs[i][slot].uuid, uuid) == 0) {
                *device = &migs[i][slot];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
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
    if (device->parent) return NVML_ERROR_NOT_SUPPORTED;
    if (!minorNumber) return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = device->minor;
    return NVML_SUCCESS;
}

/* A GPU's position in NVML's enumeration (the index nvmlDeviceGetHandleByIndex takes); MIG handles have none. */
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    CHECK_DEVICE(device, "nvmlDeviceGetIndex");
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    /* a MIG device's index is its place among its parent's MIG devices (what the toolkit names it by) */
    *index = device->parent ? (unsigned int)(device - migs[device->parent - devices])
                            : (unsigned int)(device - devices);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    CHECK_DEVICE(device, "nvmlDeviceGetPciInfo_v3");
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->parent) device = device->parent;
    memset(pci, 0, sizeof *pci);
    sscanf(device->bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = device->pci_device_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", device->bus_id);
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
    if (!device->has_mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (!currentMode || !pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = device->mig_current;
    *pendingMode = device->mig_pending;
    return NVML_SUCCESS;
}

/* Zero when MIG is not supported or not enabled, as the NVML docs say. */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMaxMigDeviceCount");
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device->has_mig_mode && device->mig_current ? device->max_mig : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    CHECK_DEVICE(device, "nvmlDeviceGetMigDeviceHandleByIndex");
    if (device->parent || !migDevice || index >= device->max_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->has_mig_mode || !device->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    if (!migs[device - devices][index].in_use) return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[device - devices][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    CHECK_DEVICE(device, "nvmlDeviceIsMigDeviceHandle");
    if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = device->parent != NULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    CHECK_DEVICE(migDevice, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    if (!device || !migDevice->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *device = migDevice->parent;
    return NVML_SUCCESS;
}

/* NVML documents this for MIG device handles only. */
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    CHECK_DEVICE(device, "nvmlDeviceGetAttributes_v2");
    if (!attributes) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->parent || !device->has_attributes) return NVML_ERROR_NOT_SUPPORTED;
    *attributes = device->attributes;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
    CHECK_DEVICE(device, "nvmlDeviceGetGpuFabricInfo");
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->parent || !device->has_fabric) return NVML_ERROR_NOT_SUPPORTED;
    *info = device->fabric;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfo_v2_t *info)
{
    CHECK_DEVICE(device, "nvmlDeviceGetGpuFabricInfoV");
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != NVML_STRUCT_VERSION(sizeof *info, 2)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (device->parent || !device->has_fabric) return NVML_ERROR_NOT_SUPPORTED;
    memcpy(info->clusterUuid, device->fabric.clusterUuid, sizeof info->clusterUuid);
    info->status = device->fabric.status;
    info->cliqueId = device->fabric.cliqueId;
    info->state = device->fabric.state;
    info->healthMask = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    CHECK_DEVICE(device, "nvmlDeviceGetGpuInstanceId");
    if (!id || !device->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *id = device->gpu_instance_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    CHECK_DEVICE(device, "nvmlDeviceGetComputeInstanceId");
    if (!id || !device->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *id = device->compute_instance_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    unsigned int slot;
    CHECK_DEVICE(device, "nvmlDeviceGetGpuInstanceById");
    if (!gpuInstance || device->parent) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->has_mig_mode || !device->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    for (slot = 0; slot < MAX_MIG; slot++) {
        struct nvmlDevice_st *m = &migs[device - devices][slot];
        if (m->in_use && m->gpu_instance_id == id) {
            *gpuInstance = m;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    CHECK_DEVICE(gpuInstance, "nvmlGpuInstanceGetInfo");
    if (!info || !gpuInstance->parent) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = gpuInstance->parent;
    info->id = gpuInstance->gpu_instance_id;
    info->profileId = gpuInstance->gpu_instance_profile_id;
    info->placement.size = gpuInstance->attributes.gpuInstanceSliceCount;
    return NVML_SUCCESS;
}

/* The profiles a GPU answers for are those its configured MIG devices use: enough for go-nvlib to
 * name a MIG device's profile (it looks up the GPU instance's and compute instance's profile ids). */
static const struct nvmlDevice_st *mig_with_gpu_profile(nvmlDevice_t device, unsigned int profile)
{
    unsigned int slot;
    for (slot = 0; slot < MAX_MIG; slot++) {
        const struct nvmlDevice_st *m = &migs[device - devices][slot];
        if (m->in_use && m->gpu_instance_profile_id == profile) return m;
    }
    return NULL;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info)
{
    const struct nvmlDevice_st *m;
    CHECK_DEVICE(device, "nvmlDeviceGetGpuInstanceProfileInfo");
    if (!info || device->parent) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->has_mig_mode || !device->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    m = mig_with_gpu_profile(device, profile);
    if (!m) return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = m->attributes.gpuInstanceSliceCount;
    info->instanceCount = 1;
    info->multiprocessorCount = m->attributes.multiprocessorCount;
    info->copyEngineCount = m->attributes.sharedCopyEngineCount;
    info->decoderCount = m->attributes.sharedDecoderCount;
    info->encoderCount = m->attributes.sharedEncoderCount;
    info->jpegCount = m->attributes.sharedJpegCount;
    info->ofaCount = m->attributes.sharedOfaCount;
    info->memorySizeMB = m->attributes.memorySizeMB;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info)
{
    CHECK_DEVICE(gpuInstance, "nvmlGpuInstanceGetComputeInstanceProfileInfo");
    if (!info || !gpuInstance->parent) return NVML_ERROR_INVALID_ARGUMENT;
    if (engProfile != 0 || profile != gpuInstance->compute_instance_profile_id) return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = gpuInstance->attributes.computeInstanceSliceCount;
    info->instanceCount = 1;
    info->multiprocessorCount = gpuInstance->attributes.multiprocessorCount;
    info->sharedCopyEngineCount = gpuInstance->attributes.sharedCopyEngineCount;
    info->sharedDecoderCount = gpuInstance->attributes.sharedDecoderCount;
    info->sharedEncoderCount = gpuInstance->attributes.sharedEncoderCount;
    info->sharedJpegCount = gpuInstance->attributes.sharedJpegCount;
    info->sharedOfaCount = gpuInstance->attributes.sharedOfaCount;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance)
{
    CHECK_DEVICE(gpuInstance, "nvmlGpuInstanceGetComputeInstanceById");
    if (!computeInstance || !gpuInstance->parent) return NVML_ERROR_INVALID_ARGUMENT;
    if (id != gpuInstance->compute_instance_id) return NVML_ERROR_NOT_FOUND;
    *computeInstance = gpuInstance;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    CHECK_DEVICE(computeInstance, "nvmlComputeInstanceGetInfo_v2");
    if (!info || !computeInstance->parent) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = computeInstance->parent;
    info->gpuInstance = computeInstance;
    info->id = computeInstance->compute_instance_id;
    info->profileId = computeInstance->compute_instance_profile_id;
    info->placement.size = computeInstance->attributes.computeInstanceSliceCount;
    return NVML_SUCCESS;
}

/* ---- events: the device plugin's health check ------------------------------------------------ */
/* A healthy GPU raises no event: every wait runs out its timeout, as it does on a real node. */

#define NVML_EVENT_TYPE_SINGLE_BIT_ECC 0x1ULL
#define NVML_EVENT_TYPE_DOUBLE_BIT_ECC 0x2ULL
#define NVML_EVENT_TYPE_XID_CRITICAL 0x8ULL

typedef struct nvmlEventSet_st {
    unsigned long long registered[MAX_DEVICES];
} *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(**set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    CHECK_DEVICE(device, "nvmlDeviceGetSupportedEventTypes");
    if (!eventTypes) return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = NVML_EVENT_TYPE_SINGLE_BIT_ECC | NVML_EVENT_TYPE_DOUBLE_BIT_ECC | NVML_EVENT_TYPE_XID_CRITICAL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    CHECK_DEVICE(device, "nvmlDeviceRegisterEvents");
    if (!set || device->parent) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered[device - devices] |= eventTypes;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec wait;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    wait.tv_sec = timeoutms / 1000;
    wait.tv_nsec = (long)(timeoutms % 1000) * 1000000L;
    while (nanosleep(&wait, &wait) != 0) {
    }
    return NVML_ERROR_TIMEOUT;
}

/* ---- topology: what the device plugin's preferred allocation weighs -------------------------- */
/* GPUs on one NUMA node share it (NVML_TOPOLOGY_NODE), others meet across the system
 * (NVML_TOPOLOGY_SYSTEM). No NVLink is modelled: its calls answer NOT_SUPPORTED, as on PCIe GPUs. */

#define NVML_TOPOLOGY_NODE 40
#define NVML_TOPOLOGY_SYSTEM 50

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2, int *pathInfo)
{
    CHECK_DEVICE(device1, "nvmlDeviceGetTopologyCommonAncestor");
    CHECK_DEVICE(device2, "nvmlDeviceGetTopologyCommonAncestor");
    if (!pathInfo || device1->parent || device2->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *pathInfo = device1->numa_node == device2->numa_node ? NVML_TOPOLOGY_NODE : NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive)
{
    CHECK_DEVICE(device, "nvmlDeviceGetNvLinkState");
    (void)link;
    if (!isActive) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    CHECK_DEVICE(device, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    (void)link;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}
