/* gpu_mirror: the mirror that completes a symmetric matrix from its upper triangle (gk_mirror_upper_*,
 * gpu_kernels.h), for Newton–Schulz's symmetric products computed in row bands (gpu_optim.cu). Its own file so the
 * CPU emulator (tests/gpu/emu/test_mirror.cpp) runs this source. */
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"

#define GM_TILE 32
#define GM_ROWS 8 /* thread rows of a block: each thread moves GM_TILE / GM_ROWS entries */

template <typename T> struct MirrorTile {
    __align__(16) T t[GM_TILE][GM_TILE + 1]; /* +1: the transposed reads fall in different banks */
};

/* Block (tile column bx, tile row by) of matrix z: a tile on or above the diagonal (bx >= by) is read whole into
 * shared memory and written transposed into tile (bx, by) below, only the entries strictly below the diagonal. The
 * diagonal tile is read whole before any of it is written (the barrier); every other destination tile lies below
 * the diagonal, which no block reads. Coalesced both ways: a warp reads and writes one row's 32 entries. */
template <typename T> __global__ void gm_mirror_kernel(T *M, int r, long stride) {
    const int bx = (int)blockIdx.x, by = (int)blockIdx.y;
    if (bx < by) return;
    __shared__ MirrorTile<T> sh;
    T *m = M + (long)blockIdx.z * stride;
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    const int col = bx * GM_TILE + tx;
    for (int i = ty; i < GM_TILE; i += GM_ROWS) {
        const int row = by * GM_TILE + i;
        if (row < r && col < r) sh.t[i][tx] = m[(long)row * r + col];
    }
    __syncthreads();
    const int dcol = by * GM_TILE + tx; /* destination: row in tile row bx, column in tile column by */
    for (int i = ty; i < GM_TILE; i += GM_ROWS) {
        const int drow = bx * GM_TILE + i;
        if (drow < r && dcol < r && drow > dcol) m[(long)drow * r + dcol] = sh.t[tx][i];
    }
}

template <typename T> static void gm_mirror(GkStream s, T *M, int r, long stride, int batch) {
    if (r <= 1 || batch <= 0) return;
    const unsigned tiles = (unsigned)((r + GM_TILE - 1) / GM_TILE);
    GK_LAUNCH(gm_mirror_kernel<T>, dim3(tiles, tiles, (unsigned)batch), dim3(GM_TILE, GM_ROWS), 0, s, M, r, stride);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_mirror_upper_f32(GkStream s, float *M, int r, long stride, int batch) {
    gm_mirror(s, M, r, stride, batch);
}

extern "C" void gk_mirror_upper_bf16(GkStream s, uint16_t *M, int r, long stride, int batch) {
    gm_mirror(s, M, r, stride, batch);
}
