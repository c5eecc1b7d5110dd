/* Hot loops of the cube data plane: open-addressing hash index build and batch lookup.
 *
 * Index layout (see runtime/cube/dictfile.py): int32 index[cap], cap a power of two,
 * -1 = empty slot, otherwise the row of the key in keys[]/values[]. Slot of a key:
 * fmix64(key) >> (64 - log2(cap)) (MurmurHash3's 64-bit finalizer, Austin Appleby,
 * public domain), then linear probing. Keys of one shard share key % shard_num, so the
 * low bits are not random: the mixer is what spreads them.
 *
 * Compiled on first use by runtime/cube/_kernel.py (cc -O3 -shared -fPIC) and called
 * through ctypes, which releases the GIL for the duration of each call.
 */
#include <stdint.h>
#include <string.h>

static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline int log2_u64(uint64_t x) { int b = 0; while ((1ULL << b) < x) b++; return b; }

/* Fills index[cap] for keys[n]. Returns 0, or -(i+1) when keys[i] repeats an earlier key,
 * or -(n+1) when the table is full (cap < n + 1). */
int64_t cube_build_index(const uint64_t *keys, int64_t n, int32_t *index, int64_t cap) {
    if (cap < n + 1) return -(n + 1);
    const uint64_t mask = (uint64_t)cap - 1;
    const int shift = 64 - log2_u64((uint64_t)cap);
    for (int64_t s = 0; s < cap; s++) index[s] = -1;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t k = keys[i];
        uint64_t h = shift == 64 ? 0 : fmix64(k) >> shift;
        while (index[h] >= 0) {
            if (keys[index[h]] == k) return -(i + 1);
            h = (h + 1) & mask;
        }
        index[h] = (int32_t)i;
    }
    return 0;
}

#ifndef CHUNK
#define CHUNK 32
#endif

/* Looks up q[qn] in (index[cap], keys, values[.., dim]). Writes found[qn] (1 hit, 0 miss)
 * and out[qn * dim] (the value row, zeros for a miss); rows[qn] (may be NULL) gets the
 * row or -1. Returns the number of hits. Works in chunks: hash + prefetch every slot of
 * the chunk, then probe, so the cache misses of a chunk overlap. */
int64_t cube_lookup(const int32_t *index, int64_t cap, const uint64_t *keys,
                    const float *values, int64_t dim, const uint64_t *q, int64_t qn,
                    float *out, uint8_t *found, int64_t *rows) {
    const uint64_t mask = (uint64_t)cap - 1;
    const int shift = 64 - log2_u64((uint64_t)cap);
    const size_t row_bytes = (size_t)dim * sizeof(float);
    int64_t hits = 0;
    uint64_t h[CHUNK];
    int32_t r[CHUNK];
    for (int64_t base = 0; base < qn; base += CHUNK) {
        const int64_t m = (qn - base) < CHUNK ? (qn - base) : CHUNK;
        for (int64_t j = 0; j < m; j++) {
            uint64_t k;
            memcpy(&k, q + base + j, 8);
            h[j] = shift == 64 ? 0 : fmix64(k) >> shift;
            __builtin_prefetch(index + h[j]);
        }
        for (int64_t j = 0; j < m; j++) {
            r[j] = index[h[j]];
            if (r[j] >= 0) {
                __builtin_prefetch(keys + r[j]);
                __builtin_prefetch(values + (size_t)r[j] * dim);
            }
        }
        for (int64_t j = 0; j < m; j++) {
            uint64_t k;
            memcpy(&k, q + base + j, 8);
            int32_t row = r[j];
            uint64_t s = h[j];
            while (row >= 0 && keys[row] != k) {
                s = (s + 1) & mask;
                row = index[s];
            }
            const int64_t o = base + j;
            if (row >= 0) {
                memcpy(out + o * dim, values + (size_t)row * dim, row_bytes);
                found[o] = 1;
                hits++;
            } else {
                memset(out + o * dim, 0, row_bytes);
                found[o] = 0;
            }
            if (rows) rows[o] = row;
        }
    }
    return hits;
}
