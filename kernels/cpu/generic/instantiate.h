// instantiate.h: includes GENERIC_FILE once per storage dtype (see
// kernels/cpu/cpu.h): FP32 and FP64 always, and BF16 and FP16 when the .c
// file defines GENERIC_LOWP (bodies that only load, compute and store; those
// that call GEMM on their operands, attention and matmul, are FP32/FP64 only
// and cpu_attention.c / cpu_matmul.c convert around them). Inside a body:
//   real      the storage type of the instantiation (uint16_t for BF16/FP16)
//   creal     the compute type: float for FP32, BF16 and FP16, double for
//             FP64; also the type of saved statistics (rstd, lse, row max,
//             partials), of RoPE tables and of AdamW's master weights and
//             moments (the FP32 of ops.h's conventions)
//   LD(x)     a stored element as creal (exact)
//   ST(v)     a value as real: rounded to nearest even for BF16/FP16
//   LOWP      1 in the BF16/FP16 instantiations, else 0
//   accreal   the type of long reductions (row sums, means): always double
//   FN(name)  name_f32, name_f64, name_bf16 or name_fp16, for static functions
//   EXP LOG SQRT FMA   the math.h function of creal's precision
//   GEMM      cblas_sgemm or cblas_dgemm (FP32/FP64 instantiations only)
//   GEMV      cblas_sgemv or cblas_dgemv (likewise)
// A .c file defines GENERIC_FILE (a path from the repository root, found
// through -I., e.g. "kernels/cpu/generic/norm.h"), includes this, then
// undefines it.
#ifndef GENERIC_FILE
#error "define GENERIC_FILE before including generic/instantiate.h"
#endif

#define accreal double
#define FN_PASTE_(name, sfx) name##_##sfx
#define FN_PASTE(name, sfx) FN_PASTE_(name, sfx)
#define FN(name) FN_PASTE(name, REAL_SFX)

#define real float
#define creal float
#define LD(x) (x)
#define ST(v) ((float)(v))
#define LOWP 0
#define REAL_SFX f32
#define EXP expf
#define LOG logf
#define SQRT sqrtf
#define FMA fmaf
#define GEMM cblas_sgemm
#define GEMV cblas_sgemv
#include GENERIC_FILE
#undef real
#undef creal
#undef LD
#undef ST
#undef LOWP
#undef REAL_SFX
#undef EXP
#undef LOG
#undef SQRT
#undef FMA
#undef GEMM
#undef GEMV

#define real double
#define creal double
#define LD(x) (x)
#define ST(v) ((double)(v))
#define LOWP 0
#define REAL_SFX f64
#define EXP exp
#define LOG log
#define SQRT sqrt
#define FMA fma
#define GEMM cblas_dgemm
#define GEMV cblas_dgemv
#include GENERIC_FILE
#undef real
#undef creal
#undef LD
#undef ST
#undef LOWP
#undef REAL_SFX
#undef EXP
#undef LOG
#undef SQRT
#undef FMA
#undef GEMM
#undef GEMV

#ifdef GENERIC_LOWP
#define real uint16_t
#define creal float
#define LOWP 1
#define EXP expf
#define LOG logf
#define SQRT sqrtf
#define FMA fmaf

#define LD(x) bf16_to_f32(x)
#define ST(v) bf16_from_f32((float)(v))
#define REAL_SFX bf16
#include GENERIC_FILE
#undef LD
#undef ST
#undef REAL_SFX

#define LD(x) fp16_to_f32(x)
#define ST(v) fp16_from_f32((float)(v))
#define REAL_SFX fp16
#include GENERIC_FILE
#undef LD
#undef ST
#undef REAL_SFX

#undef real
#undef creal
#undef LOWP
#undef EXP
#undef LOG
#undef SQRT
#undef FMA
#endif

#undef accreal
#undef FN_PASTE_
#undef FN_PASTE
#undef FN
