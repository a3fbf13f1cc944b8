// instantiate.h: includes GENERIC_FILE twice, once with real = float and once
// with real = double (see kernels/cpu/cpu.h). Inside a generic body:
//   real      the storage and compute type of the instantiation
//   accreal   the type of long reductions (row sums, means): always double
//   FN(name)  name_f32 or name_f64, for static functions
//   EXP LOG SQRT   the math.h function of that precision
//   GEMM      cblas_sgemm or cblas_dgemm
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
#define REAL_SFX f32
#define EXP expf
#define LOG logf
#define SQRT sqrtf
#define GEMM cblas_sgemm
#include GENERIC_FILE
#undef real
#undef REAL_SFX
#undef EXP
#undef LOG
#undef SQRT
#undef GEMM

#define real double
#define REAL_SFX f64
#define EXP exp
#define LOG log
#define SQRT sqrt
#define GEMM cblas_dgemm
#include GENERIC_FILE
#undef real
#undef REAL_SFX
#undef EXP
#undef LOG
#undef SQRT
#undef GEMM

#undef accreal
#undef FN_PASTE_
#undef FN_PASTE
#undef FN
