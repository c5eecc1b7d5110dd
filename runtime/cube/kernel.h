/* Shared by the cube kernel's C files (kernel.c, kernel_client.c): the mixer and the
 * inline table's home slot. See kernel.c for the layouts. */
#ifndef CUBE_KERNEL_H
#define CUBE_KERNEL_H
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the cube's files and wire protocol are little-endian; the kernel copies integers as they lie in memory"
#endif

/* MurmurHash3's 64-bit finalizer (Austin Appleby, public domain). */
static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

/* Home slot of key k in an inline table of cap slots: multiply-shift range reduction. */
static inline uint64_t home(uint64_t k, uint64_t cap) {
    return (uint64_t)(((unsigned __int128)fmix64(k) * cap) >> 64);
}

#endif
