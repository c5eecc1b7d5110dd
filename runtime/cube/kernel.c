/* Hot loops of the cube data plane: open-addressing hash index build and batch lookup.
 *
 * Index layout (see runtime/cube/dictfile.py): int32 index[cap], cap a power of two,
 * -1 = empty slot, otherwise the row of the key in keys[]/values[]. Slot of a key:
 * fmix64(key) >> (64 - log2(cap)) (MurmurHash3's 64-bit finalizer, Austin Appleby,
 * public domain), then linear probing. Keys of one shard share key % shard_num, so the
 * low bits are not random: the mixer is what spreads them.
 *
 * And the server's inline tables and versioned views (below). The cube client's request
 * path (cube_client_seek) is in kernel_client.c.
 *
 * Built when the project is installed (the extension module runtime.cube._kernel of
 * pyproject.toml; it defines no Python module, only these functions) and called through
 * ctypes by runtime/cube/kernel.py, which releases the GIL for the duration of each call.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"

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

/* ---------------------------------------------------------------- inline table
 *
 * The in-memory form the server probes (built from keys.u64/values.f32 at load time; the
 * on-disk index.i32 is not used for serving). One array of cap slots, each `stride` bytes:
 *
 *     uint64 key; float32 value[dim]; padding to stride = 8 * ceil((8 + 4 * dim) / 8)
 *
 * (48 bytes for dim 10: a random slot touches one page and at most two cache lines,
 * instead of index slot + keys row + values row: three pages). An empty slot holds the table's
 * `sentinel` key (a key not in the dict, chosen by the caller) and zero values, so a
 * probe reads only the slot itself. Home slot of a key: ((uint128)fmix64(key) * cap) >> 64
 * (multiply-shift range reduction, D. Lemire, "A fast alternative to the modulo reduction",
 * 2016: cap need not be a power of two), then linear probing (slot + 1, wrapping to 0).
 * cap > count always (load factor <= 0.7 by the caller, runtime/cube/table.py), so every probe ends on
 * the key or on an empty slot. A query equal to the sentinel is a miss without probing.
 *
 * Deletions (docs/cube.md, "Deletions"): a row of zeros is the table's default row, what a
 * miss answers, so a slot whose value is all zeros (+0.0 or -0.0) holds a DEAD key: a lookup
 * that finds it answers a miss (and a view reads no older table for it). A patch deletes a key
 * by carrying a zero row: an overlay keeps it (it shadows the base), a merge writes it over the
 * key's value, and a later new key reuses the dead slot. */

/* Whether the dim floats at row are all zeros (either sign): a dead key's value. */
static inline int row_is_zero(const uint8_t *row, int64_t dim) {
    uint32_t acc = 0, w;
    for (int64_t i = 0; i < dim; i++) {
        memcpy(&w, row + 4 * i, 4);
        acc |= w & 0x7fffffffu;
    }
    return acc == 0;
}

/* Empties table[cap * stride]: every key = sentinel, every value = 0. */
void cube_table_clear(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel) {
    memset(table, 0, (size_t)cap * stride);
    for (int64_t s = 0; s < cap; s++) memcpy(table + (size_t)s * stride, &sentinel, 8);
}

/* Flags of cube_table_insert and cube_table_merge. */
#define INSERT_UPSERT 1  /* a key already present gets the new value (else: an error) */
#define INSERT_DROP 2    /* a zero row of an absent key is not stored, a dead slot is reused */

/* Inserts keys[n] with rows values[n * dim] into table (cap slots, `used` of them occupied,
 * dead or alive). flags: INSERT_UPSERT, INSERT_DROP (above). Never stores the sentinel
 * (caller's duty to pick one absent from keys). delta[0] += slots newly occupied, delta[1] +=
 * the change of live keys (a zero row written over a live key: -1; a row written over a dead
 * one or into a free slot: +1 unless zero). Returns 0, or -(i+1) when keys[i] is a duplicate
 * (no INSERT_UPSERT) or equals the sentinel, or -(n+1) when the table would become full
 * (used + added >= cap).
 * In place under concurrent readers (the server's merge, see cube_view_lookup): a new key's
 * value is written before its key (release store); a dead slot taken by another key gets the
 * key first (release) and then its value, so a reader of the dead key never sees the new
 * value under it; a probe for another key passes over the slot unchanged; an overwritten
 * value may be read torn, so the caller guarantees that no reader of a table being merged
 * into reads a key being merged (runtime/cube/table.py). */
int64_t cube_table_insert(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                          int64_t used, const uint64_t *keys, const float *values, int64_t n,
                          int64_t dim, int flags, int64_t *delta) {
    const size_t row_bytes = (size_t)dim * sizeof(float);
    int64_t added = 0, live = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t k = keys[i];
        const uint8_t *v = (const uint8_t *)(values + (size_t)i * dim);
        if (k == sentinel) return -(i + 1);
        const int zero = row_is_zero(v, dim);
        uint64_t h = home(k, (uint64_t)cap);
        uint8_t *slot, *dead = NULL;
        uint64_t sk;
        for (;;) {
            slot = table + (size_t)h * stride;
            memcpy(&sk, slot, 8);
            if (sk == k || sk == sentinel) break;
            if ((flags & INSERT_DROP) && !dead && row_is_zero(slot + 8, dim)) dead = slot;
            if (++h == (uint64_t)cap) h = 0;
        }
        if (sk == k) {
            if (!(flags & INSERT_UPSERT)) return -(i + 1);
            live += (row_is_zero(slot + 8, dim) ? 0 : -1) + (zero ? 0 : 1);
            memcpy(slot + 8, v, row_bytes);
        } else if (zero && (flags & INSERT_DROP)) {
            continue;  /* deleting a key the table does not hold */
        } else if (dead) {
            __atomic_store_n((uint64_t *)dead, k, __ATOMIC_RELEASE);
            memcpy(dead + 8, v, row_bytes);
            live += !zero;
        } else {
            if (used + added + 1 >= cap) return -(n + 1);
            /* the value before the key (release): a concurrent probe that sees the key sees its value */
            memcpy(slot + 8, v, row_bytes);
            __atomic_store_n((uint64_t *)slot, k, __ATOMIC_RELEASE);
            added++;
            live += !zero;
        }
    }
    delta[0] += added;
    delta[1] += live;
    return 0;
}

/* Places each of keys[n] (keys the table does not hold, nonzero rows values[n * dim]) into a
 * dead slot on its probe chain, if one lies before the chain's empty slot: placed[i] = 1,
 * else 0 (left for another table). The key is written first (release), then its value, as a
 * reused slot in cube_table_insert. Returns how many were placed (each a live key more, no
 * slot more). */
int64_t cube_table_reuse(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                         const uint64_t *keys, const float *values, int64_t n, int64_t dim, uint8_t *placed) {
    const size_t row_bytes = (size_t)dim * sizeof(float);
    int64_t done = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t k = keys[i];
        placed[i] = 0;
        if (k == sentinel) continue;
        uint64_t h = home(k, (uint64_t)cap), sk;
        for (;;) {
            uint8_t *slot = table + (size_t)h * stride;
            memcpy(&sk, slot, 8);
            if (sk == k || sk == sentinel) break;
            if (row_is_zero(slot + 8, dim)) {
                __atomic_store_n((uint64_t *)slot, k, __ATOMIC_RELEASE);
                memcpy(slot + 8, values + (size_t)i * dim, row_bytes);
                placed[i] = 1;
                done++;
                break;
            }
            if (++h == (uint64_t)cap) h = 0;
        }
    }
    return done;
}

/* Builds a table from unique keys[n] / values[n * dim]: clear, then insert (no upsert; a
 * zero row is not stored: a fresh table holds no dead key). Returns the number of keys
 * stored or the error of cube_table_insert. */
int64_t cube_build_table(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                         const uint64_t *keys, const float *values, int64_t n, int64_t dim) {
    int64_t delta[2] = {0, 0};
    cube_table_clear(table, cap, stride, sentinel);
    const int64_t rc = cube_table_insert(table, cap, stride, sentinel, 0, keys, values, n, dim, INSERT_DROP, delta);
    return rc < 0 ? rc : delta[0];
}

/* Re-inserts every live slot of src (src_cap slots, src_sentinel; a dead key is left out)
 * into dst (dst_cap slots, already cleared with dst_sentinel); same stride, dim floats per
 * value. Returns the number of keys moved, or -1 when dst is too small or one of them
 * equals dst_sentinel. */
int64_t cube_table_rehash(const uint8_t *src, int64_t src_cap, uint64_t src_sentinel,
                          uint8_t *dst, int64_t dst_cap, uint64_t dst_sentinel, int64_t stride, int64_t dim) {
    int64_t moved = 0;
    for (int64_t s = 0; s < src_cap; s++) {
        const uint8_t *from = src + (size_t)s * stride;
        uint64_t k;
        memcpy(&k, from, 8);
        if (k == src_sentinel || row_is_zero(from + 8, dim)) continue;
        if (k == dst_sentinel || moved + 1 >= dst_cap) return -1;
        uint64_t h = home(k, (uint64_t)dst_cap);
        for (;;) {
            uint64_t sk;
            memcpy(&sk, dst + (size_t)h * stride, 8);
            if (sk == dst_sentinel) break;
            if (++h == (uint64_t)dst_cap) h = 0;
        }
        memcpy(dst + (size_t)h * stride, from, (size_t)stride);
        moved++;
    }
    return moved;
}

#ifndef TCHUNK
#define TCHUNK 32
#endif

/* Looks up q[qn] in the table. Writes found[qn] (1 hit, 0 miss, 2 a dead key: held, its
 * value zeros) and, when out is not NULL, out[qn * dim] (the value, zeros for a miss).
 * Returns the number of hits (live keys found). In chunks
 * of TCHUNK: hash every key of the chunk and prefetch the three cache lines from its
 * home slot's start (the slot may straddle two, and a hit reads (1 + 1 / (1 - load)) / 2
 * slots on average, Knuth: 1.75 at load 0.6), then probe + copy, so the
 * cache and TLB misses of a chunk overlap. Measured here (1M keys x 10 float32, 1000 random
 * hits, load 0.6): 2 lines 53-58 us, 3 lines 46-49 us, 4 lines 58-68 us. */
int64_t cube_table_lookup(const uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                          int64_t dim, const uint64_t *q, int64_t qn, float *out, uint8_t *found) {
    const size_t row_bytes = (size_t)dim * sizeof(float);
    int64_t hits = 0;
    uint64_t h[TCHUNK];
    for (int64_t base = 0; base < qn; base += TCHUNK) {
        const int64_t m = (qn - base) < TCHUNK ? (qn - base) : TCHUNK;
        for (int64_t j = 0; j < m; j++) {
            uint64_t k;
            memcpy(&k, q + base + j, 8);
            h[j] = home(k, (uint64_t)cap);
            const uint8_t *p = table + (size_t)h[j] * stride;
            __builtin_prefetch(p);
            __builtin_prefetch(p + 64);
            __builtin_prefetch(p + 128);
        }
        for (int64_t j = 0; j < m; j++) {
            uint64_t k;
            memcpy(&k, q + base + j, 8);
            uint64_t s = h[j];
            const uint8_t *slot = table + (size_t)s * stride;
            uint64_t sk;
            memcpy(&sk, slot, 8);
            if (k != sentinel) {
                while (sk != k && sk != sentinel) {
                    if (++s == (uint64_t)cap) s = 0;
                    slot = table + (size_t)s * stride;
                    memcpy(&sk, slot, 8);
                }
            } else {
                sk = ~k;  /* never a hit */
            }
            const int64_t o = base + j;
            if (sk == k) {
                if (out) memcpy(out + o * dim, slot + 8, row_bytes);
                const int dead = row_is_zero(slot + 8, dim);
                found[o] = dead ? 2 : 1;
                hits += !dead;
            } else {
                if (out) memset(out + o * dim, 0, row_bytes);
                found[o] = 0;
            }
        }
    }
    return hits;
}

/* ---------------------------------------------------------------- versioned views
 *
 * A version of the served dict as the server reads it (runtime/cube/table.py, VersionView):
 * a stack of inline tables of one stride: the overlays newest first, the base, then the
 * extensions (keys added past the base's headroom: no first table holds them); a key's
 * value is the one of the first table that holds it. The view lives in a uint64 array:
 *
 *     [0] pins (atomic: lookups in progress)   [1] retired (0 / 1)
 *     [2] dim   [3] stride (bytes)   [4] ntab (>= 1)   [5] nfirst (overlays + base)
 *     [6] address of one filter of every extension's keys (0: none)   [7] its words
 *     [8 + 5 * t ...] table t: address, cap, sentinel, filter address (0: none), filter
 *                     words (t = 0 newest overlay .. nfirst - 1 base .. ntab - 1)
 *
 * A table's filter (cube_filter_build): a blocked Bloom filter of its keys, uint64
 * words[nwords], 2 bits per key in one word, both from fmix64(key ^ FILTER_SALT) (the word:
 * its high bits, by multiply-shift; the bits: its low 12); a query whose bits are not both
 * set is not in the table, and the table is not probed (an overlay: most lookups miss it).
 *
 * Pinning: a lookup increments pins, then reads retired (both sequentially consistent);
 * if retired it unpins and answers -1 (not read). cube_view_retire sets retired, then a
 * writer waits until pins reads 0 (cube_view_pins): from then on no lookup reads the view,
 * so its tables may change in place (Dekker: either the lookup sees retired or the writer
 * sees the pin). */

#define VIEW_MAX_TABLES 16
#define VIEW_HEADER 8
#define FILTER_SALT 0x9e3779b97f4a7c15ULL

static inline uint64_t filter_mask(uint64_t g) { return (1ULL << (g & 63)) | (1ULL << ((g >> 6) & 63)); }

/* Builds the filter words[nwords] (nwords >= 1) of every key of table (cap slots,
 * sentinel); clear = 0 adds them to the words as they are (one filter of several tables). */
void cube_filter_build(const uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                       uint64_t *words, int64_t nwords, int clear) {
    if (clear) memset(words, 0, (size_t)nwords * 8);
    for (int64_t s = 0; s < cap; s++) {
        uint64_t k;
        memcpy(&k, table + (size_t)s * stride, 8);
        if (k == sentinel) continue;
        const uint64_t g = fmix64(k ^ FILTER_SALT);
        words[home(g, (uint64_t)nwords)] |= filter_mask(g);
    }
}

int64_t cube_view_pins(const uint64_t *view) {
    return (int64_t)__atomic_load_n(&view[0], __ATOMIC_SEQ_CST);
}

void cube_view_retire(uint64_t *view) {
    __atomic_store_n(&view[1], 1, __ATOMIC_SEQ_CST);
}

/* The tables of a view, unpacked (cube_view_lookup). */
struct view_tables {
    int64_t stride;
    const uint8_t *tab[VIEW_MAX_TABLES];
    uint64_t cap[VIEW_MAX_TABLES], sent[VIEW_MAX_TABLES], nwords[VIEW_MAX_TABLES];
    const uint64_t *filt[VIEW_MAX_TABLES];
};

/* Probes tables [t0, t1) of v, in order, for keys k[m] (m <= TCHUNK): hit[j] = the slot of
 * the first table holding k[j], left as is (NULL) when none does. First every key's filter
 * word in every table with a filter is prefetched, then every key a table's filter may hold
 * is hashed and its home slot there prefetched (the base, t == base: the three lines from
 * it, as cube_table_lookup), so the misses of all keys and tables overlap; then the probes. */
static void view_probe(const struct view_tables *v, int64_t t0, int64_t t1, int64_t base, const uint64_t *k,
                       int64_t m, const uint8_t **hit) {
    uint64_t h[VIEW_MAX_TABLES][TCHUNK];
    for (int64_t t = t0; t < t1; t++)
        if (v->filt[t])
            for (int64_t j = 0; j < m; j++) {
                h[t][j] = fmix64(k[j] ^ FILTER_SALT);
                __builtin_prefetch(v->filt[t] + home(h[t][j], v->nwords[t]));
            }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t j = 0; j < m; j++) {
            if (v->filt[t]) {
                const uint64_t g = h[t][j], fm = filter_mask(g);
                if ((v->filt[t][home(g, v->nwords[t])] & fm) != fm) {
                    h[t][j] = UINT64_MAX;  /* not in this table */
                    continue;
                }
            }
            h[t][j] = home(k[j], v->cap[t]);
            const uint8_t *p = v->tab[t] + (size_t)h[t][j] * v->stride;
            __builtin_prefetch(p);
            if (t == base) {
                __builtin_prefetch(p + 64);
                __builtin_prefetch(p + 128);
            }
        }
    for (int64_t j = 0; j < m; j++)
        for (int64_t t = t0; t < t1 && !hit[j]; t++) {
            uint64_t s = h[t][j];
            if (k[j] == v->sent[t] || s == UINT64_MAX) continue;  /* not in this table */
            const uint8_t *slot = v->tab[t] + (size_t)s * v->stride;
            uint64_t sk = __atomic_load_n((const uint64_t *)slot, __ATOMIC_ACQUIRE);
            while (sk != k[j] && sk != v->sent[t]) {
                if (++s == v->cap[t]) s = 0;
                slot = v->tab[t] + (size_t)s * v->stride;
                sk = __atomic_load_n((const uint64_t *)slot, __ATOMIC_ACQUIRE);
            }
            if (sk == k[j]) hit[j] = slot;
        }
}

/* Looks up q[qn] in the view: found[qn] (1 hit, 0 miss: absent, or dead in the first table
 * holding it) and, when out is not NULL, out[qn * dim] (the value, zeros for a miss).
 * Returns the number of hits, or -1 when the
 * view is retired (nothing written), or -2 when its table counts are out of range. Per
 * chunk of TCHUNK keys: the first `nfirst` tables (the overlays, newest first, then the
 * base) for every key, then the other tables (the extensions, whose keys no first table
 * holds) only for the keys not found that the extensions' filter (one filter of all their
 * keys) may hold: a key the base holds costs no extension's filter, an absent key one. */
int64_t cube_view_lookup(uint64_t *view, const uint64_t *q, int64_t qn, float *out, uint8_t *found) {
    __atomic_add_fetch(&view[0], 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&view[1], __ATOMIC_SEQ_CST)) {
        __atomic_sub_fetch(&view[0], 1, __ATOMIC_SEQ_CST);
        return -1;
    }
    const int64_t dim = (int64_t)view[2], ntab = (int64_t)view[4], nfirst = (int64_t)view[5];
    if (ntab < 1 || ntab > VIEW_MAX_TABLES || nfirst < 1 || nfirst > ntab) {
        __atomic_sub_fetch(&view[0], 1, __ATOMIC_SEQ_CST);
        return -2;
    }
    struct view_tables v;
    v.stride = (int64_t)view[3];
    for (int64_t t = 0; t < ntab; t++) {
        const uint64_t *e = view + VIEW_HEADER + 5 * t;
        v.tab[t] = (const uint8_t *)(uintptr_t)e[0];
        v.cap[t] = e[1];
        v.sent[t] = e[2];
        v.filt[t] = (const uint64_t *)(uintptr_t)e[3];
        v.nwords[t] = e[4];
    }
    const size_t row_bytes = (size_t)dim * sizeof(float);
    int64_t hits = 0;
    uint64_t k[TCHUNK], rest[TCHUNK], g[TCHUNK];
    int64_t where[TCHUNK];
    const uint64_t *ext_filter = (const uint64_t *)(uintptr_t)view[6], ext_words = view[7];
    const uint8_t *hit[TCHUNK], *rest_hit[TCHUNK];
    for (int64_t base = 0; base < qn; base += TCHUNK) {
        const int64_t m = (qn - base) < TCHUNK ? (qn - base) : TCHUNK;
        memcpy(k, q + base, (size_t)m * 8);
        memset(hit, 0, sizeof hit);
        view_probe(&v, 0, nfirst, nfirst - 1, k, m, hit);
        if (ntab > nfirst) {  /* the extensions, for the keys the first tables lack and their filter may hold */
            int64_t r = 0;
            if (ext_filter)
                for (int64_t j = 0; j < m; j++)
                    if (!hit[j]) {
                        g[j] = fmix64(k[j] ^ FILTER_SALT);
                        __builtin_prefetch(ext_filter + home(g[j], ext_words));
                    }
            for (int64_t j = 0; j < m; j++)
                if (!hit[j]) {
                    if (ext_filter) {
                        const uint64_t fm = filter_mask(g[j]);
                        if ((ext_filter[home(g[j], ext_words)] & fm) != fm) continue;
                    }
                    rest[r] = k[j];
                    where[r] = j;
                    rest_hit[r++] = NULL;
                }
            if (r) {
                view_probe(&v, nfirst, ntab, -1, rest, r, rest_hit);
                for (int64_t i = 0; i < r; i++) hit[where[i]] = rest_hit[i];
            }
        }
        for (int64_t j = 0; j < m; j++) {
            const int64_t o = base + j;
            if (hit[j]) {
                if (out) memcpy(out + o * dim, hit[j] + 8, row_bytes);
                const int live = !row_is_zero(hit[j] + 8, dim);
                found[o] = (uint8_t)live;
                hits += live;
            } else {
                if (out) memset(out + o * dim, 0, row_bytes);
                found[o] = 0;
            }
        }
    }
    __atomic_sub_fetch(&view[0], 1, __ATOMIC_SEQ_CST);
    return hits;
}

/* Upserts every key of src (src_cap slots, src_sentinel) into dst (dst_cap slots,
 * dst_sentinel, dst_used slots occupied), both of `stride` with dim floats per value, in
 * place as cube_table_insert does it with INSERT_UPSERT | INSERT_DROP (a zero row of src
 * deletes the key from dst, or is dropped when dst does not hold it). count_only = 1: writes
 * nothing and counts, as an upper bound, the slots it would occupy (dead slots it might
 * reuse are not counted). delta[0] += slots newly occupied, delta[1] += the change of live
 * keys (count_only: delta[0] only). Returns 0, or -1 when a src key equals dst_sentinel or
 * dst would be full (nothing written past that point: callers check with count_only first). */
int64_t cube_table_merge(uint8_t *dst, int64_t dst_cap, uint64_t dst_sentinel, int64_t dst_used,
                         const uint8_t *src, int64_t src_cap, uint64_t src_sentinel, int64_t stride,
                         int64_t dim, int count_only, int64_t *delta) {
    for (int64_t s = 0; s < src_cap; s++) {
        const uint8_t *from = src + (size_t)s * stride;
        uint64_t k;
        memcpy(&k, from, 8);
        if (k == src_sentinel) continue;
        if (k == dst_sentinel) return -1;
        if (count_only) {
            uint64_t h = home(k, (uint64_t)dst_cap), sk;
            for (;;) {
                memcpy(&sk, dst + (size_t)h * stride, 8);
                if (sk == k || sk == dst_sentinel) break;
                if (++h == (uint64_t)dst_cap) h = 0;
            }
            delta[0] += sk != k && !row_is_zero(from + 8, dim);
            continue;
        }
        const int64_t rc = cube_table_insert(dst, dst_cap, stride, dst_sentinel, dst_used + delta[0], &k,
                                             (const float *)(from + 8), 1, dim, INSERT_UPSERT | INSERT_DROP, delta);
        if (rc < 0) return -1;
    }
    return 0;
}
