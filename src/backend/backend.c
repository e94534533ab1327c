/*
 * backend.c: picks a backend by name. CUDA is linked only in builds made
 * with nvcc present (KILN_CUDA); asking for it elsewhere is a clear error.
 */
#include "backend/backend.h"

#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"

#ifdef KILN_CUDA
struct kiln_backend *cuda_backend_create(char *err, size_t errlen);
int cuda_available(void);
#endif

struct kiln_backend *backend_create(const char *name, int n_threads, char *err, size_t errlen) {
    if (!name || !strcmp(name, "auto")) name = backend_default_name();
    if (!strcmp(name, "cpu")) return cpu_backend_create(n_threads, err, errlen);
    if (!strcmp(name, "cuda")) {
#ifdef KILN_CUDA
        return cuda_backend_create(err, errlen);
#else
        kiln_errf(err, errlen, "backend 'cuda': this kiln was built without CUDA (nvcc was not found at build time)");
        return NULL;
#endif
    }
    kiln_errf(err, errlen, "unknown backend '%s' (cpu, cuda)", name);
    return NULL;
}

const char *backend_default_name(void) {
#ifdef KILN_CUDA
    if (cuda_available()) return "cuda";
#endif
    return "cpu";
}
