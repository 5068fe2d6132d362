/* A copy that bypasses the writer's caches where the CPU has such stores (see fc_streamcopy.h). */
#include "fc_streamcopy.h"

#include <stdint.h>
#include <string.h>

/* FC_PORTABLE (CI's build of the paths macOS takes) copies as Apple silicon does, so CI tests both. */
#if defined(__x86_64__) && defined(__SSE2__) && !defined(FC_PORTABLE)
#include <emmintrin.h>

void fc_stream_copy(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t lead = (16 - ((uintptr_t)d & 15)) & 15; /* bytes until d is 16-byte aligned */
    if (lead > n)
        lead = n;
    memcpy(d, s, lead);
    d += lead;
    s += lead;
    n -= lead;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
    _mm_sfence(); /* streaming stores are weakly ordered: they land before the publishing store */
}

#else

void fc_stream_copy(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

#endif
