/* The registry of link kinds: a new kind is its file plus one line here. */
#include "fc_link.h"

#include <string.h>

extern const fc_link_kind fc_link_tcp;
extern const fc_link_kind fc_link_shm;
#ifdef FC_HAVE_VERBS
extern const fc_link_kind fc_link_verbs;
#endif

static const fc_link_kind *const kinds[] = {
    &fc_link_tcp,
    &fc_link_shm,
#ifdef FC_HAVE_VERBS
    &fc_link_verbs,
#endif
};

#define KIND_COUNT (sizeof kinds / sizeof kinds[0])

const fc_link_kind *fc_link_kind_at(size_t i)
{
    return i < KIND_COUNT ? kinds[i] : NULL;
}

const fc_link_kind *fc_link_kind_named(const char *name)
{
    for (size_t i = 0; name && i < KIND_COUNT; i++)
        if (strcmp(kinds[i]->name, name) == 0)
            return kinds[i];
    return NULL;
}
