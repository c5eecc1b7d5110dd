/* Hot loops of the cube data plane: open-addressing hash index build and batch lookup.
 *
 * Index layout (see runtime/cube/dictfile.py): int32 index[cap], cap a power of two,
 * -1 = empty slot, otherwise the row of the key in keys[]/values[]. Slot of a key:
 * fmix64(key) >> (64 - log2(cap)) (MurmurHash3's 64-bit finalizer, Austin Appleby,
 * public domain), then linear probing. Keys of one shard share key % shard_num, so the
 * low bits are not random: the mixer is what spreads them.
 *
 * And the cube client's request path (cube_client_seek, at the end).
 *
 * Built when the project is installed (the extension module runtime.cube._kernel of
 * pyproject.toml; it defines no Python module, only these functions) and called through
 * ctypes by runtime/cube/kernel.py, which releases the GIL for the duration of each call.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the cube wire protocol is little-endian; the client's request path copies integers as they lie in memory"
#endif

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
 * the key or on an empty slot. A query equal to the sentinel is a miss without probing. */

static inline uint64_t home(uint64_t k, uint64_t cap) {
    return (uint64_t)(((unsigned __int128)fmix64(k) * cap) >> 64);
}

/* Empties table[cap * stride]: every key = sentinel, every value = 0. */
void cube_table_clear(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel) {
    memset(table, 0, (size_t)cap * stride);
    for (int64_t s = 0; s < cap; s++) memcpy(table + (size_t)s * stride, &sentinel, 8);
}

/* Inserts keys[n] with rows values[n * dim] into table. upsert = 0: a key already present
 * is an error; 1: its value is overwritten. Never stores the sentinel (caller's duty to
 * pick one absent from keys). Returns the number of keys added (>= 0), or -(i+1) when
 * keys[i] is a duplicate (upsert = 0) or equals the sentinel, or -(n+1) when the table
 * would become full (count + added >= cap; `count`: keys already in the table). */
int64_t cube_table_insert(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                          int64_t count, const uint64_t *keys, const float *values, int64_t n,
                          int64_t dim, int upsert) {
    const size_t row_bytes = (size_t)dim * sizeof(float);
    int64_t added = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t k = keys[i];
        if (k == sentinel) return -(i + 1);
        uint64_t h = home(k, (uint64_t)cap);
        uint8_t *slot;
        uint64_t sk;
        for (;;) {
            slot = table + (size_t)h * stride;
            memcpy(&sk, slot, 8);
            if (sk == k || sk == sentinel) break;
            if (++h == (uint64_t)cap) h = 0;
        }
        if (sk == k) {
            if (!upsert) return -(i + 1);
        } else {
            if (count + added + 1 >= cap) return -(n + 1);
            memcpy(slot, &k, 8);
            added++;
        }
        memcpy(slot + 8, values + (size_t)i * dim, row_bytes);
    }
    return added;
}

/* Builds a table from unique keys[n] / values[n * dim]: clear, then insert (no upsert).
 * Returns the number of keys (n) or the error of cube_table_insert. */
int64_t cube_build_table(uint8_t *table, int64_t cap, int64_t stride, uint64_t sentinel,
                         const uint64_t *keys, const float *values, int64_t n, int64_t dim) {
    cube_table_clear(table, cap, stride, sentinel);
    return cube_table_insert(table, cap, stride, sentinel, 0, keys, values, n, dim, 0);
}

/* Re-inserts every occupied slot of src (src_cap slots, src_sentinel) into dst (dst_cap
 * slots, already cleared with dst_sentinel); same stride. Returns the number of keys
 * moved, or -1 when dst is too small or one of them equals dst_sentinel. */
int64_t cube_table_rehash(const uint8_t *src, int64_t src_cap, uint64_t src_sentinel,
                          uint8_t *dst, int64_t dst_cap, uint64_t dst_sentinel, int64_t stride) {
    int64_t moved = 0;
    for (int64_t s = 0; s < src_cap; s++) {
        const uint8_t *from = src + (size_t)s * stride;
        uint64_t k;
        memcpy(&k, from, 8);
        if (k == src_sentinel) continue;
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

/* Looks up q[qn] in the table. Writes found[qn] (1 hit, 0 miss) and, when out is not
 * NULL, out[qn * dim] (the value, zeros for a miss). Returns the number of hits. In chunks
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
                found[o] = 1;
                hits++;
            } else {
                if (out) memset(out + o * dim, 0, row_bytes);
                found[o] = 0;
            }
        }
    }
    return hits;
}

/* ---------------------------------------------------------------------------------------
 * The cube client's request path (runtime/cube/client.py: CubeClient.seek's common case).
 *
 * One batch seek over shard_num shards, one connection per shard already chosen by the
 * caller (fds[s]: a connected, non-blocking TCP socket to a replica of shard s): split the
 * keys by shard (key % shard_num, key & (shard_num - 1) for a power of two, as
 * runtime/formats/topology.py's shard_of), write every shard's SEEK request, then read
 * the replies with poll() until all are complete or timeout_us has passed, and put every
 * OK reply's found/values back in the batch's order. Frames follow runtime/cube/protocol.py
 * (the owner of the wire format; its docstring has the layout): little-endian, request
 * header of 28 bytes after the u32 length, reply header of 36, found mask padded to 8.
 *
 * keys[n]; values[n * dim] and found[n] are written for the rows of every shard whose
 * reply is OK (other rows are left as they were). meta[3 * s ...]: the shard's outcome,
 * its reply's version and other (the previous version held). Outcome: the reply's status
 * byte (0 = OK), or CS_NONE (no keys on that shard: nothing sent), CS_IO (send/recv
 * failed or the peer closed), CS_TIMEOUT, CS_MALFORMED (bad magic, or a length, count or
 * dim that disagrees with the request). Returns 0 when every shard asked answered OK,
 * 1 otherwise, -1 when out of memory (nothing sent). Holds no lock and touches no Python
 * object: called through ctypes, which releases the GIL around it.
 */
#define CS_NONE (-1)
#define CS_IO (-2)
#define CS_TIMEOUT (-3)
#define CS_MALFORMED (-4)
#define CUBE_MAGIC 0x45425543u
#define REQ_PREFIX 32
#define REP_PREFIX 40
#define ERROR_ROOM (REP_PREFIX + 4096)  /* an error reply: header + message (protocol.py's MAX_ERROR_MESSAGE) */

static int64_t mono_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static int wait_ms(int64_t deadline_us) {
    const int64_t left = deadline_us - mono_us();
    return left <= 0 ? 0 : (int)((left + 999) / 1000);
}

/* Writes len bytes of buf to fd (non-blocking) by deadline_us; 0 or an outcome (< 0). */
static int send_all(int fd, const uint8_t *buf, size_t len, int64_t deadline_us) {
    size_t done = 0;
    while (done < len) {
        const ssize_t w = send(fd, buf + done, len - done, MSG_NOSIGNAL);
        if (w > 0) { done += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {fd, POLLOUT, 0};
            const int ms = wait_ms(deadline_us);
            if (ms == 0) return CS_TIMEOUT;
            if (poll(&p, 1, ms) < 0 && errno != EINTR) return CS_IO;
            continue;
        }
        return CS_IO;
    }
    return 0;
}

int64_t cube_client_seek(const uint64_t *keys, int64_t n, int64_t shard_num, const int32_t *fds,
                         int64_t dim, uint64_t version, int64_t timeout_us,
                         float *values, uint8_t *found, int64_t *meta) {
    const int64_t S = shard_num;
    const int pow2 = (S & (S - 1)) == 0;
    /* per shard: key count, offset of its rows, request and reply buffers */
    int64_t *cnt = calloc((size_t)(5 * S + 1), sizeof(int64_t));
    uint32_t *shard = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    int32_t *rows = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    uint8_t **req = calloc((size_t)S, sizeof(uint8_t *));
    uint8_t **rep = calloc((size_t)S, sizeof(uint8_t *));
    struct pollfd *pf = malloc((size_t)S * sizeof(struct pollfd));
    int64_t rc = -1;
    if (!cnt || !shard || !rows || !req || !rep || !pf || n > INT32_MAX) goto out;
    int64_t *start = cnt + S, *have = cnt + 2 * S, *cap = cnt + 3 * S, *wait = cnt + 4 * S;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t s = (uint32_t)(pow2 ? (keys[i] & (uint64_t)(S - 1)) : (keys[i] % (uint64_t)S));
        shard[i] = s;
        cnt[s]++;
    }
    for (int64_t s = 0, at = 0; s < S; s++) {
        start[s] = at;
        at += cnt[s];
        if (!cnt[s]) continue;
        const int64_t values_at = REP_PREFIX + ((cnt[s] + 7) & ~7LL);
        const int64_t size = values_at + 4 * cnt[s] * dim;
        cap[s] = size > ERROR_ROOM ? size : ERROR_ROOM;
        req[s] = malloc((size_t)(REQ_PREFIX + 8 * cnt[s]));
        rep[s] = malloc((size_t)cap[s]);
        if (!req[s] || !rep[s]) goto out;
        const uint32_t head[8] = {(uint32_t)(REQ_PREFIX - 4 + 8 * cnt[s]), CUBE_MAGIC,
                                  1u | ((version ? 1u : 0u) << 8), 0, (uint32_t)cnt[s], 0,
                                  (uint32_t)version, (uint32_t)(version >> 32)};
        memcpy(req[s], head, sizeof head);  /* length, magic, op|flags<<8|rsv, id, count, rsv, version */
    }
    {   /* rows in shard order; keys copied into each request in that order */
        int64_t *fill = have;  /* reused as a cursor, reset below */
        for (int64_t s = 0; s < S; s++) fill[s] = 0;
        for (int64_t i = 0; i < n; i++) {
            const uint32_t s = shard[i];
            rows[start[s] + fill[s]] = (int32_t)i;
            memcpy(req[s] + REQ_PREFIX + 8 * fill[s], keys + i, 8);
            fill[s]++;
        }
        for (int64_t s = 0; s < S; s++) fill[s] = 0;
    }
    const int64_t deadline = mono_us() + timeout_us;
    int64_t pending = 0;
    for (int64_t s = 0; s < S; s++) {
        meta[3 * s] = CS_NONE;
        meta[3 * s + 1] = meta[3 * s + 2] = 0;
        if (!cnt[s]) continue;
        const int e = send_all(fds[s], req[s], (size_t)(REQ_PREFIX + 8 * cnt[s]), deadline);
        meta[3 * s] = e ? e : CS_TIMEOUT;  /* CS_TIMEOUT until its reply is complete */
        if (!e) { wait[s] = 1; pending++; }
    }
    while (pending) {
        int64_t m = 0;
        for (int64_t s = 0; s < S; s++)
            if (wait[s]) { pf[m].fd = fds[s]; pf[m].events = POLLIN; pf[m].revents = 0; m++; }
        const int ms = wait_ms(deadline);
        if (ms == 0) break;
        const int r = poll(pf, (nfds_t)m, ms);
        if (r < 0 && errno != EINTR) break;  /* every pending shard stays CS_TIMEOUT */
        if (r <= 0) continue;
        for (int64_t s = 0, j = 0; s < S; s++) {
            if (!wait[s]) continue;
            const short ev = pf[j++].revents;
            if (!ev) continue;
            for (;;) {  /* read what is there */
                uint32_t len = 0;
                if (have[s] >= 4) memcpy(&len, rep[s], 4);
                const int64_t want = have[s] >= 4 ? (int64_t)len + 4 : 4;
                if (have[s] >= 4 && (want > cap[s] || want < REP_PREFIX)) { meta[3 * s] = CS_MALFORMED; break; }
                if (have[s] >= want && have[s] >= 4) break;
                const ssize_t got = recv(fds[s], rep[s] + have[s], (size_t)(want - have[s]), 0);
                if (got > 0) { have[s] += got; continue; }
                if (got < 0 && errno == EINTR) continue;
                if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                meta[3 * s] = CS_IO;  /* closed (0) or failed */
                break;
            }
            if (meta[3 * s] != CS_TIMEOUT) { wait[s] = 0; pending--; continue; }
            uint32_t len = 0;
            if (have[s] < 4) continue;
            memcpy(&len, rep[s], 4);
            if (have[s] < (int64_t)len + 4) continue;  /* incomplete */
            wait[s] = 0;
            pending--;
            const uint8_t *f = rep[s];
            uint32_t magic, count, rdim;
            memcpy(&magic, f + 4, 4);
            memcpy(&count, f + 16, 4);
            memcpy(&rdim, f + 20, 4);
            memcpy(&meta[3 * s + 1], f + 24, 8);
            memcpy(&meta[3 * s + 2], f + 32, 8);
            const uint8_t status = f[8];
            if (magic != CUBE_MAGIC) { meta[3 * s] = CS_MALFORMED; continue; }
            if (status != 0) { meta[3 * s] = status; continue; }
            const int64_t values_at = REP_PREFIX + ((cnt[s] + 7) & ~7LL);
            if ((int64_t)count != cnt[s] || (int64_t)rdim != dim ||
                (int64_t)len + 4 != values_at + 4 * cnt[s] * dim) { meta[3 * s] = CS_MALFORMED; continue; }
            const int32_t *r0 = rows + start[s];
            const uint8_t *fm = f + REP_PREFIX;
            const float *v = (const float *)(f + values_at);  /* 8-aligned: malloc'd, offset % 8 == 0 */
            const size_t row_bytes = (size_t)dim * sizeof(float);
            for (int64_t j2 = 0; j2 < cnt[s]; j2++) {
                found[r0[j2]] = fm[j2] != 0;
                memcpy(values + (size_t)r0[j2] * dim, v + (size_t)j2 * dim, row_bytes);
            }
            meta[3 * s] = 0;
        }
    }
    rc = 0;
    for (int64_t s = 0; s < S; s++)
        if (cnt[s] && meta[3 * s] != 0) rc = 1;
out:
    if (req) for (int64_t s = 0; s < S; s++) free(req[s]);
    if (rep) for (int64_t s = 0; s < S; s++) free(rep[s]);
    free(req); free(rep); free(pf); free(rows); free(shard); free(cnt);
    return rc;
}
