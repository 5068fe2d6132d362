/* fcfab: faults on request (FCFAB_FAULT), applied by the process that sends, to UC queue pairs.
 * "drop:N", "dup:N" and "delay:N:US", comma-separated: the N-th send (from 1, counted over all
 * this process's UC queue pairs) is dropped, delivered twice, or delivered US microseconds late. */
#include "fcfab.h"

#include <stdlib.h>
#include <string.h>

#define FC_MAX_FAULTS 64

enum fc_fault_kind { FC_DROP, FC_DUP, FC_DELAY };

struct fc_fault {
    enum fc_fault_kind kind;
    uint64_t n;
    uint32_t us;
};

static struct fc_fault faults[FC_MAX_FAULTS];
static int nfaults;
static _Atomic uint64_t sends;

static int parse_number(const char *s, const char **end, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > max)
            return -1;
        p++;
    }
    *end = p;
    *out = v;
    return p == s ? -1 : 0;
}

/* One "kind:N[:US]" item that ends at `stop`; 0 when it reads as a fault. */
static int parse_one(const char *s, const char *stop, struct fc_fault *f)
{
    static const char *names[] = {"drop:", "dup:", "delay:"};
    const char *p = NULL;
    uint64_t us = 0;
    for (int k = 0; k < 3 && !p; k++)
        if (strncmp(s, names[k], strlen(names[k])) == 0) {
            f->kind = (enum fc_fault_kind)k;
            p = s + strlen(names[k]);
        }
    if (!p || parse_number(p, &p, (uint64_t)1 << 48, &f->n) != 0 || f->n == 0)
        return -1;
    if (f->kind == FC_DELAY) {
        if (*p != ':' || parse_number(p + 1, &p, FC_MAX_DELAY_US, &us) != 0)
            return -1;
    }
    f->us = (uint32_t)us;
    return p == stop ? 0 : -1;
}

int fc_faults_parse(const char *spec, struct fc_config *cfg)
{
    nfaults = 0;
    if (!spec || !*spec)
        return 0;
    for (const char *s = spec; *s;) {
        const char *stop = strchr(s, ',');
        if (!stop)
            stop = s + strlen(s);
        if (nfaults == FC_MAX_FAULTS || parse_one(s, stop, &faults[nfaults]) != 0) {
            fc_config_error(cfg, "FCFAB_FAULT=%s: want drop:N, dup:N or delay:N:US (N from 1, US up to "
                                 "60000000), comma-separated, at most 64", spec);
            nfaults = 0;
            return -1;
        }
        nfaults++;
        s = *stop ? stop + 1 : stop;
    }
    return 0;
}

/* What happens to this process's next UC send: dropped, or how many copies, how late. */
void fc_faults_for_next_send(int *drop, int *copies, uint32_t *delay_us)
{
    uint64_t n = atomic_fetch_add(&sends, 1) + 1;
    *drop = 0;
    *copies = 1;
    *delay_us = 0;
    for (int i = 0; i < nfaults; i++) {
        if (faults[i].n != n)
            continue;
        if (faults[i].kind == FC_DROP)
            *drop = 1;
        else if (faults[i].kind == FC_DUP)
            *copies = 2;
        else if (faults[i].us > *delay_us)
            *delay_us = faults[i].us;
    }
}
