/* The memory of large results: a cache of blocks that numpy result arrays are made over.
 *
 * A collective returns a new array. Memory for a large one comes straight from the kernel, which
 * must find and zero fresh pages for every call: a quarter of a 64 MiB all_reduce's CPU time on 4
 * ranks (bench/NOTES.md, entry 70). Here a block goes back to its cache when the last array over
 * it is gone, and the next result of about its size is made over it. The cache keeps a few blocks
 * up to a byte limit and frees them when its engine closes; a block that outlives its cache is
 * freed. Everything here runs with the GIL held (a block dies with the last Python reference), so
 * it needs no lock. Blocks are mapped (fc_mem.h), so that what the cache frees, at finalize above
 * all, goes back to the system at once.
 */
#include "py_common.h"

#include <sys/mman.h>

#include "base/fc_mem.h"

#define KEPT_MAX 4     /* blocks kept at once */
#define BLOCK_ALIGN 64 /* a cache line: what the reductions' vector loads like best */
/* A block this large starts on a 2 MiB boundary and asks Linux for huge pages, as numpy does
 * for its own large arrays: 4 KiB pages cost a fault each the first time, and TLB misses after. */
#define HUGE_BYTES ((size_t)4 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct {
    PyObject_HEAD
    void *kept[KEPT_MAX]; /* oldest first */
    size_t kept_cap[KEPT_MAX];
    int nkept;
    size_t held;  /* bytes kept now */
    size_t limit; /* the most bytes kept at once; 0: nothing is kept */
    int closed;
} CacheObject;

typedef struct {
    PyObject_HEAD
    CacheObject *cache; /* where the memory goes back (a strong reference) */
    void *mem;
    size_t cap; /* bytes allocated */
    size_t len; /* bytes the buffer shows */
} BlockObject;

static PyTypeObject block_type;

/* Take kept block i out of the cache: its memory (cap: its size). */
static void *take_out(CacheObject *c, int i, size_t *cap)
{
    void *mem = c->kept[i];
    *cap = c->kept_cap[i];
    c->held -= *cap;
    c->nkept--;
    for (; i < c->nkept; i++) {
        c->kept[i] = c->kept[i + 1];
        c->kept_cap[i] = c->kept_cap[i + 1];
    }
    return mem;
}

static void drop_oldest(CacheObject *c)
{
    size_t cap;
    void *mem = take_out(c, 0, &cap);
    fc_unmap(mem, cap);
}

/* Keep `mem` (cap bytes) if the cache is open and it fits under the limit; else free it. */
static void give_back(CacheObject *c, void *mem, size_t cap)
{
    if (!c || c->closed || cap > c->limit) {
        fc_unmap(mem, cap);
        return;
    }
    while (c->nkept && (c->nkept == KEPT_MAX || c->held + cap > c->limit))
        drop_oldest(c);
    c->kept[c->nkept] = mem;
    c->kept_cap[c->nkept] = cap;
    c->nkept++;
    c->held += cap;
}

/* A kept block for n bytes, taken out of the cache (the smallest that holds n without wasting
 * more than half of itself; of equals the one kept last, whose lines a cache may still hold), or
 * NULL. */
static void *reuse(CacheObject *c, size_t n, size_t *cap)
{
    int best = -1;
    for (int i = c->nkept - 1; i >= 0; i--)
        if (c->kept_cap[i] >= n && c->kept_cap[i] / 2 <= n && (best < 0 || c->kept_cap[i] < c->kept_cap[best]))
            best = i;
    return best < 0 ? NULL : take_out(c, best, cap);
}

/* New memory for n bytes (cap: what was mapped), or NULL. Mapped, never malloc'd: freeing a
 * large malloc'd block raises glibc's mmap threshold, after which the next blocks come from a
 * heap that varying sizes fragment and that is never given back, at finalize either (fc_mem.h). */
static void *fresh(size_t n, size_t *cap)
{
    size_t align = n >= HUGE_BYTES ? HUGE_ALIGN : BLOCK_ALIGN;
    if (n > SIZE_MAX - align)
        return NULL;
    *cap = (n + align - 1) / align * align;
    void *mem = fc_map(*cap, align);
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(FC_PORTABLE)
    if (mem && n >= HUGE_BYTES)
        (void)madvise(mem, *cap, MADV_HUGEPAGE); /* advice only: without it the block still works */
#endif
    return mem;
}

static void cache_free_kept(CacheObject *c)
{
    while (c->nkept)
        drop_oldest(c);
}

static PyObject *cache_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    long long limit;
    static char *kw[] = {"limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L", kw, &limit))
        return NULL;
    if (limit < 0)
        return PyErr_Format(PyExc_ValueError, "a result cache's limit is a number of bytes >= 0, not %lld", limit);
    CacheObject *c = (CacheObject *)type->tp_alloc(type, 0);
    if (c)
        c->limit = (unsigned long long)limit > SIZE_MAX ? SIZE_MAX : (size_t)limit;
    return (PyObject *)c;
}

static void cache_dealloc(CacheObject *c)
{
    cache_free_kept(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* take(nbytes): a writable buffer of nbytes, from a kept block when one fits. */
static PyObject *cache_take(CacheObject *c, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0)
        return PyErr_Format(PyExc_ValueError, "a result block holds at least 1 byte, not %zd", n);
    size_t cap = 0;
    void *mem = c->closed ? NULL : reuse(c, (size_t)n, &cap);
    if (!mem && !(mem = fresh((size_t)n, &cap)))
        return PyErr_NoMemory();
    BlockObject *b = PyObject_New(BlockObject, &block_type);
    if (!b) {
        give_back(c, mem, cap);
        return NULL;
    }
    b->cache = (CacheObject *)Py_NewRef((PyObject *)c);
    b->mem = mem;
    b->cap = cap;
    b->len = (size_t)n;
    return (PyObject *)b;
}

/* close(): free the kept blocks; blocks given back later are freed. */
static PyObject *cache_close(CacheObject *c, PyObject *unused)
{
    (void)unused;
    c->closed = 1;
    cache_free_kept(c);
    Py_RETURN_NONE;
}

static PyObject *cache_kept(CacheObject *c, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(c->held);
}

static PyMethodDef cache_methods[] = {
    {"take", (PyCFunction)cache_take, METH_O, "take(nbytes): a writable buffer for a result"},
    {"close", (PyCFunction)cache_close, METH_NOARGS, "free what is kept; keep nothing more"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cache_getset[] = {
    {"kept", (getter)cache_kept, NULL, "bytes kept for the next results", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject py_result_cache_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.ResultCache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ResultCache(limit): memory for large results, up to `limit` bytes kept between calls.",
    .tp_new = cache_new,
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};

static void block_dealloc(BlockObject *b)
{
    give_back(b->cache, b->mem, b->cap);
    Py_XDECREF(b->cache);
    PyObject_Free(b);
}

static int block_getbuffer(BlockObject *b, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)b, b->mem, (Py_ssize_t)b->len, 0, flags);
}

static PyBufferProcs block_buffer = {(getbufferproc)block_getbuffer, NULL};

static PyTypeObject block_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.ResultBlock",
    .tp_basicsize = sizeof(BlockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory for one result; it goes back to its cache when the last reference is gone.",
    .tp_dealloc = (destructor)block_dealloc,
    .tp_as_buffer = &block_buffer,
};

int py_results_ready(void)
{
    return PyType_Ready(&py_result_cache_type) || PyType_Ready(&block_type) ? -1 : 0;
}
