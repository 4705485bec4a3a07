/* dtype.h - element types.  Codes are PyTorch's c10::ScalarType values so the
 * Python layer can pass them through unchanged. */
#ifndef TP_DTYPE_H
#define TP_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_dtype {
  TP_U8 = 0,
  TP_I8 = 1,
  TP_I16 = 2,
  TP_I32 = 3,
  TP_I64 = 4,
  TP_F16 = 5,
  TP_F32 = 6,
  TP_F64 = 7,
  TP_C64 = 9,
  TP_C128 = 10,
  TP_BOOL = 11,
  TP_BF16 = 15,
  TP_F8E5M2 = 23,
  TP_F8E4M3FN = 24,
  TP_F8E5M2FNUZ = 25,
  TP_F8E4M3FNUZ = 26,
  TP_U16 = 27,
  TP_U32 = 28,
  TP_U64 = 29,
  TP_DTYPE_INVALID = -1,
} tp_dtype;

/* Bytes per element; 0 for an unknown code. */
size_t tp_dtype_size(tp_dtype dt);
/* PyTorch-style name ("float32"); "invalid" for an unknown code. */
const char *tp_dtype_name(tp_dtype dt);
/* MLIR element type ("f32", "i64", "i1", "ui8", "bf16"); NULL if unsupported. */
const char *tp_dtype_mlir(tp_dtype dt);
/* PJRT_Buffer_Type value for the dtype; 0 (INVALID) if unsupported. */
int tp_dtype_to_pjrt(tp_dtype dt);
tp_dtype tp_dtype_from_pjrt(int pjrt_type);

int tp_dtype_is_float(tp_dtype dt);   /* f8 (the four float8 types), f16, bf16, f32, f64 */
int tp_dtype_is_f8(tp_dtype dt);
int tp_dtype_is_complex(tp_dtype dt);
int tp_dtype_is_int(tp_dtype dt);     /* signed or unsigned integers, not bool */
int tp_dtype_is_unsigned(tp_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
