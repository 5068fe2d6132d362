/* Loading the verbs library on first use (fc_verbs_lib.h says why it is never linked). */
#include "fc_verbs_lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef __APPLE__
#define DEFAULT_LIBRARY "librdma.dylib"
#else
#define DEFAULT_LIBRARY "libibverbs.so.1"
#endif

#define PATH_MAX_LEN 1024

static const struct {
    const char *symbol;
    size_t offset;
} SYMBOLS[] = {
    {"ibv_get_device_list", offsetof(fc_verbs_lib, get_device_list)},
    {"ibv_free_device_list", offsetof(fc_verbs_lib, free_device_list)},
    {"ibv_get_device_name", offsetof(fc_verbs_lib, get_device_name)},
    {"ibv_open_device", offsetof(fc_verbs_lib, open_device)},
    {"ibv_close_device", offsetof(fc_verbs_lib, close_device)},
    {"ibv_query_port", offsetof(fc_verbs_lib, query_port)},
    {"ibv_query_gid", offsetof(fc_verbs_lib, query_gid)},
    {"ibv_alloc_pd", offsetof(fc_verbs_lib, alloc_pd)},
    {"ibv_dealloc_pd", offsetof(fc_verbs_lib, dealloc_pd)},
    {"ibv_reg_mr", offsetof(fc_verbs_lib, reg_mr)},
    {"ibv_dereg_mr", offsetof(fc_verbs_lib, dereg_mr)},
    {"ibv_create_cq", offsetof(fc_verbs_lib, create_cq)},
    {"ibv_destroy_cq", offsetof(fc_verbs_lib, destroy_cq)},
    {"ibv_create_qp", offsetof(fc_verbs_lib, create_qp)},
    {"ibv_destroy_qp", offsetof(fc_verbs_lib, destroy_qp)},
    {"ibv_modify_qp", offsetof(fc_verbs_lib, modify_qp)},
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fc_verbs_lib lib;
static int loaded;
static char loaded_path[PATH_MAX_LEN];

const char *fc_verbs_default_library(void)
{
    return DEFAULT_LIBRARY;
}

/* dlerror()'s text on one line (a reason is one line). */
static void one_line(char *s)
{
    for (; *s; s++)
        if (*s == '\n' || *s == '\r')
            *s = ' ';
}

/* Fill `t` from `handle`. 0, or -1 naming the first missing function. */
static int resolve(void *handle, fc_verbs_lib *t, const char *path, char *why, size_t why_len)
{
    for (size_t i = 0; i < sizeof SYMBOLS / sizeof SYMBOLS[0]; i++) {
        void *sym = dlsym(handle, SYMBOLS[i].symbol);
        if (!sym) {
            snprintf(why, why_len, "the verbs library %s has no %s: it is not a verbs library, or too old",
                     path, SYMBOLS[i].symbol);
            return -1;
        }
        /* (POSIX makes a function's address from dlsym's; memcpy keeps ISO C's pedantry quiet) */
        void (*fn)(void);
        _Static_assert(sizeof fn == sizeof sym, "function and data pointers differ in size");
        memcpy((char *)t + SYMBOLS[i].offset, &sym, sizeof sym);
    }
    return 0;
}

/* Load `path` into lib (the lock held). 0, or -1 with why. */
static int load_locked(const char *path, char *why, size_t why_len)
{
    if (strlen(path) >= PATH_MAX_LEN) {
        snprintf(why, why_len, "the verbs library's path is longer than %d bytes", PATH_MAX_LEN - 1);
        return -1;
    }
    /* RTLD_LOCAL: the provider's names stay out of the process's namespace. Never unloaded once
     * used: providers keep threads and state that outlive their last object. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *e = dlerror();
        char said[512];
        snprintf(said, sizeof said, "%s", e ? e : "no reason given");
        one_line(said);
        snprintf(why, why_len, "could not load the verbs library %s (%s)", path, said);
        return -1;
    }
    fc_verbs_lib t;
    memset(&t, 0, sizeof t);
    if (resolve(handle, &t, path, why, why_len)) {
        dlclose(handle);
        return -1;
    }
    memcpy(loaded_path, path, strlen(path) + 1);
    t.path = loaded_path;
    lib = t;
    loaded = 1;
    return 0;
}

const fc_verbs_lib *fc_verbs_load(const char *path, char *why, size_t why_len)
{
    if (!path || !path[0])
        path = DEFAULT_LIBRARY;
    const fc_verbs_lib *r = NULL;
    pthread_mutex_lock(&lock);
    if (!loaded) {
        if (load_locked(path, why, why_len) == 0)
            r = &lib;
    } else if (strcmp(loaded_path, path) == 0) {
        r = &lib;
    } else {
        snprintf(why, why_len, "this process already uses the verbs library %s; a link asked for %s", loaded_path,
                 path);
    }
    pthread_mutex_unlock(&lock);
    return r;
}
