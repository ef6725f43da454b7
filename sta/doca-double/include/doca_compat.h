/* doca_compat.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_COMPAT_H
#define DOCA_DOUBLE_COMPAT_H

/* The real SDK marks STA functions experimental (deprecated unless
 * DOCA_ALLOW_EXPERIMENTAL_API is defined); the double accepts both ways. */
#ifndef DOCA_EXPERIMENTAL
#define DOCA_EXPERIMENTAL
#endif
#ifndef DOCA_STABLE
#define DOCA_STABLE
#endif
#endif /* DOCA_DOUBLE_COMPAT_H */
