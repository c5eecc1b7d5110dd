/* The cube client's request path, called through ctypes by runtime/cube/kernel.py (built
 * into the same library as kernel.c: runtime.cube._kernel). */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "kernel.h"

/* ---------------------------------------------------------------------------------------
 * The cube client's request path (runtime/cube/client/: CubeClient.seek's common case).
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
