/* kernel_table: the hot kernels of one CPU level, as a table of function pointers.
 *
 * kernels_isa.c (the float ops of kernels.inc), attention.c and the bf16 matrix-vector kernel are compiled once
 * per level, each time with that level's -march and their names suffixed _generic, _avx2, _avx512 (Makefile);
 * each compilation fills one table. The ops' public names (kernels.h, attention.h) call through the table of the
 * process's level (cpu.h: CPUID, or ZAYA_CPU). Tests call a level's table directly to compare levels. */
#ifndef ZAYA_KERNEL_TABLE_H
#define ZAYA_KERNEL_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"
#include "kernels/cpu.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"

/* ZK(return type, name, (parameters), (arguments)) for every op with a public name: the float ops of kernels.inc
 * (ZY_FLOAT_OPS, listed in kernels.h) and the attention kernels (ZY_ATTENTION_OPS, attention.h) ... */
#define ZY_KERNEL_OPS(ZK) ZY_FLOAT_OPS(ZK) ZY_ATTENTION_OPS(ZK)
/* ... and the kernels that only matmul.c calls. matmul_bf16_block: Y[r, o] = Σ_k X[r, k] · W16[o, k] for rows
 * r < nr (nr <= ZY_BF16_ROW_BLOCK), outputs o in [o0, o1): bf16 weights widened to fp32, fp32 accumulation.
 * matmul_f32_block: the same with fp32 weights W [out, in] (nr <= 4), tiles of dot products (matmul.c's few-row path).
 * f32_to_bf16_row: dst[i] = zy_f32_to_bf16(src[i]) (nearest even, NaN kept quiet), vectorised. */
#define ZY_KERNEL_INTERNAL(ZK) \
    ZK(void, matmul_bf16_block, (int nr, int o0, int o1, int in, const float *X, int ldx, const uint16_t *W16, \
                                float *Y, int ldy), (nr, o0, o1, in, X, ldx, W16, Y, ldy)) \
    ZK(void, matmul_f32_block, (int nr, int o0, int o1, int in, const float *X, int ldx, const float *W, float *Y, \
                               int ldy), (nr, o0, o1, in, X, ldx, W, Y, ldy)) \
    ZK(void, f32_to_bf16_row, (uint16_t *dst, const float *src, int n), (dst, src, n))
#define ZY_KERNEL_LIST(ZK) ZY_KERNEL_OPS(ZK) ZY_KERNEL_INTERNAL(ZK)

#define ZY_KERNEL_FIELD(ret, name, params, args) ret(*name) params;
typedef struct {
    const char *level; /* the level it was compiled for */
    ZY_KERNEL_LIST(ZY_KERNEL_FIELD)
} ZyKernelTable;
#undef ZY_KERNEL_FIELD

/* In a per-level compilation (-DZY_ISA=avx2): a name with the level's suffix (NAME_avx2), and the declarations of
 * that level's functions. */
#ifdef ZY_ISA
#define ZY_PASTE_(a, b) a##_##b
#define ZY_PASTE(a, b) ZY_PASTE_(a, b)
#define ZY_ISA_NAME(name) ZY_PASTE(name, ZY_ISA)
#define ZY_KERNEL_DECL(ret, name, params, args) ret ZY_ISA_NAME(name) params;
ZY_KERNEL_LIST(ZY_KERNEL_DECL)
#undef ZY_KERNEL_DECL
#endif

/* The table compiled for a level (levels above the ones compiled in give the highest compiled one below them:
 * avx512bf16 shares avx512's ops, its own bf16 kernels live in matmul.c). Never NULL. */
const ZyKernelTable *zy_kernel_table(ZyCpuLevel level);
/* The process's table: zy_kernel_table(zy_cpu_level()). */
const ZyKernelTable *zy_kernels(void);

#endif
