/* dtype.c - element type tables (see dtype.h). */
#include "dtype.h"

#include <pjrt_c_api.h>

typedef struct dtype_info {
  tp_dtype dt;
  size_t size;
  const char *name; /* PyTorch name */
  const char *mlir; /* MLIR element type */
  PJRT_Buffer_Type pjrt;
} dtype_info;

static const dtype_info kInfos[] = {
    {TP_U8, 1, "uint8", "ui8", PJRT_Buffer_Type_U8},
    {TP_I8, 1, "int8", "i8", PJRT_Buffer_Type_S8},
    {TP_I16, 2, "int16", "i16", PJRT_Buffer_Type_S16},
    {TP_I32, 4, "int32", "i32", PJRT_Buffer_Type_S32},
    {TP_I64, 8, "int64", "i64", PJRT_Buffer_Type_S64},
    {TP_F16, 2, "float16", "f16", PJRT_Buffer_Type_F16},
    {TP_F32, 4, "float32", "f32", PJRT_Buffer_Type_F32},
    {TP_F64, 8, "float64", "f64", PJRT_Buffer_Type_F64},
    {TP_C64, 8, "complex64", "complex<f32>", PJRT_Buffer_Type_C64},
    {TP_C128, 16, "complex128", "complex<f64>", PJRT_Buffer_Type_C128},
    {TP_BOOL, 1, "bool", "i1", PJRT_Buffer_Type_PRED},
    {TP_BF16, 2, "bfloat16", "bf16", PJRT_Buffer_Type_BF16},
    {TP_F8E5M2, 1, "float8_e5m2", "f8E5M2", PJRT_Buffer_Type_F8E5M2},
    {TP_F8E4M3FN, 1, "float8_e4m3fn", "f8E4M3FN", PJRT_Buffer_Type_F8E4M3FN},
    {TP_F8E5M2FNUZ, 1, "float8_e5m2fnuz", "f8E5M2FNUZ", PJRT_Buffer_Type_F8E5M2FNUZ},
    {TP_F8E4M3FNUZ, 1, "float8_e4m3fnuz", "f8E4M3FNUZ", PJRT_Buffer_Type_F8E4M3FNUZ},
    {TP_U16, 2, "uint16", "ui16", PJRT_Buffer_Type_U16},
    {TP_U32, 4, "uint32", "ui32", PJRT_Buffer_Type_U32},
    {TP_U64, 8, "uint64", "ui64", PJRT_Buffer_Type_U64},
};
#define NUM_INFOS (sizeof(kInfos) / sizeof(kInfos[0]))

static const dtype_info *find(tp_dtype dt) {
  for (size_t i = 0; i < NUM_INFOS; i++)
    if (kInfos[i].dt == dt) return &kInfos[i];
  return NULL;
}

size_t tp_dtype_size(tp_dtype dt) {
  const dtype_info *d = find(dt);
  return d ? d->size : 0;
}

const char *tp_dtype_name(tp_dtype dt) {
  const dtype_info *d = find(dt);
  return d ? d->name : "invalid";
}

const char *tp_dtype_mlir(tp_dtype dt) {
  const dtype_info *d = find(dt);
  return d ? d->mlir : NULL;
}

int tp_dtype_to_pjrt(tp_dtype dt) {
  const dtype_info *d = find(dt);
  return d ? (int)d->pjrt : (int)PJRT_Buffer_Type_INVALID;
}

tp_dtype tp_dtype_from_pjrt(int pjrt_type) {
  if (pjrt_type == (int)PJRT_Buffer_Type_INVALID) return TP_DTYPE_INVALID;
  for (size_t i = 0; i < NUM_INFOS; i++)
    if ((int)kInfos[i].pjrt == pjrt_type) return kInfos[i].dt;
  return TP_DTYPE_INVALID;
}

int tp_dtype_is_f8(tp_dtype dt) {
  return dt == TP_F8E5M2 || dt == TP_F8E4M3FN || dt == TP_F8E5M2FNUZ || dt == TP_F8E4M3FNUZ;
}

int tp_dtype_is_float(tp_dtype dt) {
  return dt == TP_F16 || dt == TP_BF16 || dt == TP_F32 || dt == TP_F64 || tp_dtype_is_f8(dt);
}

int tp_dtype_is_complex(tp_dtype dt) { return dt == TP_C64 || dt == TP_C128; }

int tp_dtype_is_unsigned(tp_dtype dt) {
  return dt == TP_U8 || dt == TP_U16 || dt == TP_U32 || dt == TP_U64;
}

int tp_dtype_is_int(tp_dtype dt) {
  return tp_dtype_is_unsigned(dt) || dt == TP_I8 || dt == TP_I16 ||
         dt == TP_I32 || dt == TP_I64;
}
